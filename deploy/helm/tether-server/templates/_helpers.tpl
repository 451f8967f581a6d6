{{/* Chart name, overridable. */}}
{{- define "tether-server.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name of the release's resources, at most 63 characters. */}}
{{- define "tether-server.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Standard labels. */}}
{{- define "tether-server.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "tether-server.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tether
{{- end }}

{{/* Labels that select the server's pods. */}}
{{- define "tether-server.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tether-server.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: server
{{- end }}

{{- define "tether-server.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "tether-server.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "tether-server.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Secret names: the existing one when given, else the one the chart creates. */}}
{{- define "tether-server.jwtSecretName" -}}
{{- default (printf "%s-jwt" (include "tether-server.fullname" .)) .Values.jwt.existingSecret }}
{{- end }}

{{- define "tether-server.tlsSecretName" -}}
{{- default (printf "%s-tls" (include "tether-server.fullname" .)) .Values.tls.existingSecret }}
{{- end }}

{{- define "tether-server.adminSecretName" -}}
{{- default (printf "%s-admin-token" (include "tether-server.fullname" .)) .Values.adminToken.existingSecret }}
{{- end }}

{{/* Whether the tunnel listener has a certificate (otherwise: self-signed). */}}
{{- define "tether-server.hasTLS" -}}
{{- if or .Values.tls.existingSecret (and .Values.tls.cert .Values.tls.key) }}true{{- end }}
{{- end }}

{{/* Where the Secrets are mounted. Whole-directory mounts, never subPath, so
a rotated Secret reaches the running server, which re-reads the files. */}}
{{- define "tether-server.jwtDir" -}}/etc/tether/jwt{{- end }}
{{- define "tether-server.tlsDir" -}}/etc/tether/tls{{- end }}
{{- define "tether-server.adminDir" -}}/etc/tether/admin{{- end }}
{{- define "tether-server.configDir" -}}/etc/tether/config{{- end }}

{{/* terminationGracePeriodSeconds: the preStop delay, then the server's
drain (--shutdown-timeout), then a margin for closing the tunnels. */}}
{{- define "tether-server.gracePeriod" -}}
{{- add (int .Values.drain.preStopSleepSeconds) (int .Values.drain.shutdownTimeoutSeconds) (int .Values.drain.marginSeconds) }}
{{- end }}

{{/* The server's config file (keys are `tether server` flag names). */}}
{{- define "tether-server.config" -}}
{{- if not .Values.domain }}
{{- fail "domain is required: set --set domain=tunnels.example.com (tunnel N is served at N.<domain>)" }}
{{- end }}
{{- if not (or .Values.jwt.existingSecret .Values.jwt.publicKey) }}
{{- fail "a token verification key is required: set jwt.existingSecret to a Secret holding it, or jwt.publicKey to the PEM from `tether token keygen --public-key`" }}
{{- end }}
{{- if and (or .Values.tls.cert .Values.tls.key) (not (and .Values.tls.cert .Values.tls.key)) }}
{{- fail "tls.cert and tls.key go together: set both, or neither (and tls.existingSecret)" }}
{{- end }}
{{- $cfg := dict
  "domain" .Values.domain
  "tunnel-addr" (printf "0.0.0.0:%d" (int .Values.ports.tunnel))
  "http-addr" (printf "0.0.0.0:%d" (int .Values.ports.http))
  "admin-addr" (printf "0.0.0.0:%d" (int .Values.ports.admin))
  "admin-token-file" (printf "%s/%s" (include "tether-server.adminDir" .) .Values.adminToken.secretKey)
  "jwt-public-key" (printf "%s/%s" (include "tether-server.jwtDir" .) .Values.jwt.secretKey)
  "shutdown-timeout" (printf "%ds" (int .Values.drain.shutdownTimeoutSeconds))
  "log-level" .Values.log.level
  "log-format" .Values.log.format
}}
{{- if include "tether-server.hasTLS" . }}
{{- $_ := set $cfg "tls-cert" (printf "%s/tls.crt" (include "tether-server.tlsDir" .)) }}
{{- $_ := set $cfg "tls-key" (printf "%s/tls.key" (include "tether-server.tlsDir" .)) }}
{{- end }}
{{- with .Values.jwt.issuer }}{{ $_ := set $cfg "jwt-issuer" . }}{{ end }}
{{- with .Values.jwt.audience }}{{ $_ := set $cfg "jwt-audience" . }}{{ end }}
{{- with .Values.trustedProxies }}{{ $_ := set $cfg "trusted-proxies" . }}{{ end }}
{{- with .Values.heartbeatTimeout }}{{ $_ := set $cfg "heartbeat-timeout" . }}{{ end }}
{{- if .Values.publicURL }}
{{- $_ := set $cfg "public-url" .Values.publicURL }}
{{- else if .Values.ingress.enabled }}
{{- $_ := set $cfg "public-url" (printf "%s://*.%s" (ternary "https" "http" .Values.ingress.tls.enabled) .Values.domain) }}
{{- end }}
{{- toYaml (merge $cfg .Values.extraConfig) }}
{{- end }}
