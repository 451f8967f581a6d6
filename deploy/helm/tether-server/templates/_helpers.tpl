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

{{- define "tether-server.peerSecretName" -}}
{{- default (printf "%s-peer" (include "tether-server.fullname" .)) .Values.peerSecret.existingSecret }}
{{- end }}

{{/* The kubernetes.io/tls Secret the peer channel's certificates come from
(peerTLS): the existing one, or the one the chart's Certificate writes. No
name: they are made from the peer secret. */}}
{{- define "tether-server.peerTLSSecretName" -}}
{{- if .Values.peerTLS.certManager.enabled }}
{{- printf "%s-peer-tls" (include "tether-server.fullname" .) }}
{{- else }}
{{- .Values.peerTLS.existingSecret }}
{{- end }}
{{- end }}

{{/*
A secret the chart makes, base64-encoded, for a Secret named .name whose key
.key holds it. Only with generateSecrets: otherwise it fails with .what,
since a random value differs at every `helm template`, and a GitOps tool
that renders with it would restart the pods (and split the replicas' peer
secret) at every sync. With generateSecrets the value is random once and
kept: the chart looks the installed Secret up (which `helm template` and
--dry-run cannot).
*/}}
{{- define "tether-server.generated" -}}
{{- if not .ctx.Values.generateSecrets }}
{{- fail (printf "%s; or set generateSecrets=true to let the chart make a random one (not with GitOps tools that render with helm template: they would make a new one at every sync)" .what) }}
{{- end }}
{{- $value := randAlphaNum 48 | b64enc }}
{{- with lookup "v1" "Secret" .ctx.Release.Namespace .name }}
{{- with index .data $.key }}
{{- $value = . }}
{{- end }}
{{- end }}
{{- $value }}
{{- end }}

{{/* The trial Redis (redis.enabled): its name (Deployment, Service, Secret)
and the labels that select its pod. */}}
{{- define "tether-server.redisName" -}}
{{- printf "%s-redis" (include "tether-server.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tether-server.redisSelectorLabels" -}}
app.kubernetes.io/name: {{ include "tether-server.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: redis
{{- end }}

{{- define "tether-server.redisLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "tether-server.redisSelectorLabels" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tether
{{- end }}

{{/* The trial Redis's Secret: its password, for the server's
--registry-password-file, and its config file, which holds the same password
(Redis reads it from there, not from its command line). Called with ctx,
name and password. */}}
{{- define "tether-server.redisSecret" -}}
apiVersion: v1
kind: Secret
metadata:
  name: {{ .name }}
  labels:
    {{- include "tether-server.redisLabels" .ctx | nindent 4 }}
type: Opaque
data:
  password: {{ .password | b64enc }}
  redis.conf: {{ printf "# The trial Redis of tether-server: not for production.\nport 6379\nrequirepass %s\nsave \"\"\nappendonly no\n" (quote .password) | b64enc }}
{{- end }}

{{/* Whether the replicas share a Redis registry: then the server gets the
peer listener, its credentials (the peer secret, or peerTLS's certificates)
and a replica ID, and may run as several replicas.
"memory" is the single-replica default, not a shared registry. */}}
{{- define "tether-server.shared" -}}
{{- if or .Values.redis.enabled .Values.registry.urlSecret.name (and .Values.registry.url (ne .Values.registry.url "memory")) }}true{{- end }}
{{- end }}

{{/* The Secret and key of the Redis password file; no name: none. */}}
{{- define "tether-server.registryPasswordSecretName" -}}
{{- if .Values.redis.enabled }}
{{- include "tether-server.redisName" . }}
{{- else }}
{{- .Values.registry.passwordSecret.name }}
{{- end }}
{{- end }}

{{- define "tether-server.registryPasswordKey" -}}
{{- ternary "password" .Values.registry.passwordSecret.key .Values.redis.enabled }}
{{- end }}

{{/* The registry settings, checked: the chart refuses what the server would
refuse at start, with the value to change. */}}
{{- define "tether-server.checkRegistry" -}}
{{- $r := .Values.registry }}
{{- if and .Values.redis.enabled (or $r.url $r.urlSecret.name $r.passwordSecret.name) }}
{{- fail "redis.enabled runs a trial Redis and makes it the registry: unset registry.url, registry.urlSecret.name and registry.passwordSecret.name, or set redis.enabled=false to use your Redis" }}
{{- end }}
{{- if and $r.url (ne $r.url "memory") (not (regexMatch "^rediss?://" $r.url)) }}
{{- fail (printf "registry.url %q: want redis://HOST[:PORT][/DB], rediss://HOST[:PORT][/DB] (TLS), or empty for a single replica" $r.url) }}
{{- end }}
{{- if and $r.passwordSecret.name (not (include "tether-server.shared" .)) }}
{{- fail "registry.passwordSecret.name is set but there is no Redis registry: set registry.url (or registry.urlSecret.name) too" }}
{{- end }}
{{- if not (include "tether-server.shared" .) }}
{{- if .Values.autoscaling.enabled }}
{{- fail "autoscaling.enabled needs a registry the replicas share, so that each serves the tunnels the others hold: set registry.url=redis://HOST:6379 (or registry.urlSecret.name), or redis.enabled=true to try it out" }}
{{- end }}
{{- if gt (int .Values.replicaCount) 1 }}
{{- fail (printf "replicaCount is %d, but more than one replica needs a registry the replicas share, so that each serves the tunnels the others hold: set registry.url=redis://HOST:6379 (or registry.urlSecret.name), or redis.enabled=true to try it out; or replicaCount=1" (int .Values.replicaCount)) }}
{{- end }}
{{- end }}
{{- end }}

{{/* persistence, checked before the registry settings so that the refusal
names it: the file in --data-dir is held by one process at a time, and the
server refuses it with a Redis registry, where the replicas keep the state. */}}
{{- define "tether-server.checkPersistence" -}}
{{- if .Values.persistence.enabled }}
{{- if include "tether-server.shared" . }}
{{- fail "persistence.enabled keeps a single replica's revocations and buffered webhooks on a volume (--data-dir), but a Redis registry is set (registry.url, registry.urlSecret.name or redis.enabled), where the replicas keep them: set persistence.enabled=false, or drop the registry to run one replica" }}
{{- end }}
{{- if .Values.autoscaling.enabled }}
{{- fail "persistence.enabled is for a single replica (one process at a time holds the file in --data-dir), and autoscaling.enabled runs several: set autoscaling.enabled=false, or persistence.enabled=false and share a Redis registry (registry.url), where the replicas keep their state" }}
{{- end }}
{{- if gt (int .Values.replicaCount) 1 }}
{{- fail (printf "persistence.enabled is for a single replica (one process at a time holds the file in --data-dir), but replicaCount is %d: set replicaCount=1, or persistence.enabled=false and share a Redis registry (registry.url), where the replicas keep their state" (int .Values.replicaCount)) }}
{{- end }}
{{- end }}
{{- end }}

{{/* The claim mounted at the data directory (persistence.enabled). */}}
{{- define "tether-server.dataClaimName" -}}
{{- default (printf "%s-data" (include "tether-server.fullname" .)) .Values.persistence.existingClaim }}
{{- end }}

{{/* The peer certificate settings, checked, naming the value to change. */}}
{{- define "tether-server.checkPeerTLS" -}}
{{- $p := .Values.peerTLS }}
{{- if and $p.existingSecret $p.certManager.enabled }}
{{- fail (printf "peerTLS.existingSecret and peerTLS.certManager.enabled exclude each other: the chart's Certificate writes the Secret %s-peer-tls itself; set one of them" (include "tether-server.fullname" .)) }}
{{- end }}
{{- if and $p.certManager.enabled (not $p.certManager.issuerRef.name) }}
{{- fail "peerTLS.certManager.issuerRef.name is required with peerTLS.certManager.enabled: name a cert-manager Issuer (or a ClusterIssuer, with issuerRef.kind=ClusterIssuer) dedicated to the replicas, such as a CA Issuer whose CA signs nothing else, since the peer port admits whatever certificate that CA signed (deploy/README.md, \"Peer certificates from cert-manager\")" }}
{{- end }}
{{- if and (include "tether-server.peerTLSSecretName" .) (not (include "tether-server.shared" .)) }}
{{- fail "peerTLS is set but there is no Redis registry: the peer channel runs between replicas that share one; set registry.url (or registry.urlSecret.name, or redis.enabled), or unset peerTLS.existingSecret and peerTLS.certManager.enabled" }}
{{- end }}
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
{{- define "tether-server.peerDir" -}}/etc/tether/peer{{- end }}
{{- define "tether-server.peerTLSDir" -}}/etc/tether/peer-tls{{- end }}
{{- define "tether-server.registryDir" -}}/etc/tether/registry{{- end }}
{{- define "tether-server.configDir" -}}/etc/tether/config{{- end }}
{{- define "tether-server.renewalDir" -}}/etc/tether/token-renewal{{- end }}
{{/* The volume of persistence.enabled (--data-dir). */}}
{{- define "tether-server.dataDir" -}}/var/lib/tether{{- end }}

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
{{- include "tether-server.checkPersistence" . }}
{{- include "tether-server.checkRegistry" . }}
{{- include "tether-server.checkPeerTLS" . }}
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
{{- with .Values.tokenRenewal.existingSecret }}{{ $_ := set $cfg "token-renewal-key" (printf "%s/%s" (include "tether-server.renewalDir" $) $.Values.tokenRenewal.secretKey) }}{{ end }}
{{- with .Values.jwt.issuer }}{{ $_ := set $cfg "jwt-issuer" . }}{{ end }}
{{- with .Values.jwt.audience }}{{ $_ := set $cfg "jwt-audience" . }}{{ end }}
{{- with .Values.trustedProxies }}{{ $_ := set $cfg "trusted-proxies" . }}{{ end }}
{{- with .Values.heartbeatTimeout }}{{ $_ := set $cfg "heartbeat-timeout" . }}{{ end }}
{{- with int .Values.maxSessionsPerTunnel }}{{ $_ := set $cfg "max-sessions-per-tunnel" . }}{{ end }}
{{- if .Values.accessLog }}{{ $_ := set $cfg "access-log" true }}{{ end }}
{{- if .Values.persistence.enabled }}{{ $_ := set $cfg "data-dir" (include "tether-server.dataDir" .) }}{{ end }}
{{- $buf := .Values.webhookBuffer }}
{{- with $buf.retention }}{{ $_ := set $cfg "buffer-retention" . }}{{ end }}
{{- with int64 $buf.maxBody }}{{ $_ := set $cfg "buffer-max-body" . }}{{ end }}
{{- with int64 $buf.maxRequests }}{{ $_ := set $cfg "buffer-max-requests" . }}{{ end }}
{{- with int64 $buf.maxBytes }}{{ $_ := set $cfg "buffer-max-bytes" . }}{{ end }}
{{- with int64 $buf.maxTotalBytes }}{{ $_ := set $cfg "buffer-max-total-bytes" . }}{{ end }}
{{- if include "tether-server.shared" . }}
{{- /* --replica-id and --peer-advertise-addr differ per pod: the
Deployment sets them from the downward API; so does TETHER_REGISTRY from
registry.urlSecret. */}}
{{- if .Values.redis.enabled }}
{{- $_ := set $cfg "registry" (printf "redis://%s.%s.svc:6379/0" (include "tether-server.redisName" .) .Release.Namespace) }}
{{- else if not .Values.registry.urlSecret.name }}
{{- $_ := set $cfg "registry" .Values.registry.url }}
{{- end }}
{{- if include "tether-server.registryPasswordSecretName" . }}
{{- $_ := set $cfg "registry-password-file" (printf "%s/%s" (include "tether-server.registryDir" .) (include "tether-server.registryPasswordKey" .)) }}
{{- end }}
{{- $_ := set $cfg "peer-addr" (printf "0.0.0.0:%d" (int .Values.ports.peer)) }}
{{- if include "tether-server.peerTLSSecretName" . }}
{{- $dir := include "tether-server.peerTLSDir" . }}
{{- $_ := set $cfg "peer-tls-cert" (printf "%s/tls.crt" $dir) }}
{{- $_ := set $cfg "peer-tls-key" (printf "%s/tls.key" $dir) }}
{{- $_ := set $cfg "peer-tls-ca" (printf "%s/ca.crt" $dir) }}
{{- else }}
{{- $_ := set $cfg "peer-secret-file" (printf "%s/%s" (include "tether-server.peerDir" .) .Values.peerSecret.secretKey) }}
{{- end }}
{{- end }}
{{- if .Values.publicURL }}
{{- $_ := set $cfg "public-url" .Values.publicURL }}
{{- else if .Values.ingress.enabled }}
{{- $_ := set $cfg "public-url" (printf "%s://*.%s" (ternary "https" "http" .Values.ingress.tls.enabled) .Values.domain) }}
{{- end }}
{{- toYaml (merge $cfg .Values.extraConfig) }}
{{- end }}
