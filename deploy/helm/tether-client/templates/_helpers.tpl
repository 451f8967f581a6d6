{{/*
The helpers take a context with .Values (this chart's values), .Release and
.Chart, so that they work both in this chart and when a runtime chart
includes the sidecar with (index .Subcharts "tether-client"), this chart's
own context. The chart name is spelt out instead of read from .Chart, as the
older form of the include, (dict "Values" (index .Values "tether-client")
"Release" .Release), has no .Chart.
*/}}

{{/* Chart name, overridable. */}}
{{- define "tether-client.name" -}}
{{- default "tether-client" .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name of the release's resources, at most 63 characters. */}}
{{- define "tether-client.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default "tether-client" .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Standard labels (the chart's own resources only). */}}
{{- define "tether-client.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "tether-client.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tether
{{- end }}

{{/* Labels that select the client's pods. */}}
{{- define "tether-client.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tether-client.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: tunnel-client
{{- end }}

{{- define "tether-client.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "tether-client.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The image; without a tag, this chart's appVersion: the release's tag. */}}
{{- define "tether-client.image" -}}
{{- $tag := .Values.image.tag }}
{{- if and (not $tag) (hasKey . "Chart") }}
{{- $tag = .Chart.AppVersion }}
{{- end }}
{{- if not $tag }}
{{- fail "tether-client: include the sidecar with (index .Subcharts \"tether-client\") so that it knows its chart's appVersion, the image tag; or set tether-client.image.tag" }}
{{- end }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}

{{- define "tether-client.tokenSecretName" -}}
{{- default (printf "%s-token" (include "tether-client.fullname" .)) .Values.token.existingSecret }}
{{- end }}

{{/* Where the token and the CA bundle are mounted (whole directories, never
subPath, so a rotated Secret reaches the running client). */}}
{{- define "tether-client.tokenDir" -}}/var/run/tether/token{{- end }}
{{- define "tether-client.caDir" -}}/etc/tether/ca{{- end }}

{{/* The --route values, one PREFIX=URL[;timeout=D][;insecure-skip-verify] a line. */}}
{{- define "tether-client.routes" -}}
{{- range $name := list "appProxy" "argoCD" "argoWorkflows" "argoEvents" "argoRollouts" }}
{{- $r := index $.Values.routes $name }}
{{- if $r.enabled }}
{{- $spec := printf "%s=%s" $r.prefix $r.url }}
{{- with $r.timeout }}{{ $spec = printf "%s;timeout=%s" $spec . }}{{ end }}
{{- if $r.insecureSkipVerify }}{{ $spec = printf "%s;insecure-skip-verify" $spec }}{{ end }}
{{ $spec }}
{{- end }}
{{- end }}
{{- range .Values.extraRoutes }}
{{ . }}
{{- end }}
{{- end }}

{{/*
The client's settings as FLAG=VALUE lines. The container gets them as
TETHER_<FLAG> environment variables rather than arguments, so that
`tether diagnose` and `tether status`, run in the container with kubectl exec,
see exactly the settings the client runs with and need no arguments.
*/}}
{{- define "tether-client.settings" -}}
{{- if not .Values.server }}
{{- fail "server is required: set server=HOST:PORT of the tunnel server (tether-client.server in a runtime chart)" }}
{{- end }}
{{- if not (or .Values.token.existingSecret .Values.token.value) }}
{{- fail "a token is required: set token.existingSecret to a Secret holding the JWT from `tether token issue` (or token.value)" }}
{{- end }}
{{- if and .Values.tls.caConfigMap .Values.tls.caSecret }}
{{- fail "tls.caConfigMap and tls.caSecret are exclusive: set one" }}
{{- end }}
{{- $conns := int .Values.connections }}
{{- if or (lt $conns 1) (gt $conns 16) }}
{{- fail (printf "connections is %v: want 1 to 16 sessions to the server (default 2)" .Values.connections) }}
{{- end }}
{{- $routes := include "tether-client.routes" . | trim }}
{{- if not $routes }}
{{- fail "no routes: enable at least one of routes.* or list extraRoutes" }}
{{- end }}
server={{ .Values.server }}
token-file={{ include "tether-client.tokenDir" . }}/{{ .Values.token.secretKey }}
{{- if .Values.token.keepRenewed }}
renewed-token-file=/tmp/renewed-token
{{- end }}
health-addr=0.0.0.0:{{ .Values.health.port }}
transport={{ .Values.transport }}
connections={{ $conns }}
log-level={{ .Values.log.level }}
log-format={{ .Values.log.format }}
route={{ splitList "\n" $routes | join "," }}
{{- with .Values.proxy.url }}
proxy={{ . }}
{{- end }}
{{- if or .Values.tls.caConfigMap .Values.tls.caSecret }}
tls-ca={{ include "tether-client.caDir" . }}/{{ .Values.tls.caKey }}
{{- end }}
{{- with .Values.tls.fingerprint }}
tls-fingerprint={{ . }}
{{- end }}
{{- with .Values.tls.serverName }}
tls-server-name={{ . }}
{{- end }}
{{- end }}
