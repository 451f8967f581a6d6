{{/*
The tether client as a container, for this chart's Deployment and for a
runtime chart's pod (the sidecar). In a chart that depends on tether-client:

  containers:
    {{- include "tether-client.container" (index .Subcharts "tether-client") | nindent 4 }}
  volumes:
    {{- include "tether-client.volumes" (index .Subcharts "tether-client") | nindent 4 }}

Both render YAML list items. The container runs as the nonroot user with a
read-only root filesystem (and an emptyDir at /tmp), whatever the host pod's
securityContext says. Its settings are TETHER_* environment variables, so in
the running pod `kubectl exec POD -c tether-client -- tether diagnose` (or
`tether status`) needs no arguments.

Readiness (probes.readiness.mode): by default, in the client's own
Deployment (ownDeployment in the context) the container is ready while the
tunnel is logged in (/readyz), so a rolling update waits for the new pod's
login; as a sidecar it is ready while the process runs (/healthz): the
runtime's pod must not turn NotReady, and its rollouts stall, because of the
platform.
*/}}
{{- define "tether-client.readinessPath" -}}
{{- $mode := .Values.probes.readiness.mode | default (ternary "tunnel" "process" (hasKey . "ownDeployment")) }}
{{- if eq $mode "tunnel" }}/readyz
{{- else if eq $mode "process" }}/healthz
{{- else }}
{{- fail (printf "probes.readiness.mode %q is not one of tunnel, process or \"\"" $mode) }}
{{- end }}
{{- end }}
{{- define "tether-client.container" -}}
- name: tether-client
  image: {{ include "tether-client.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  args: ["client"]
  env:
    {{- range splitList "\n" (include "tether-client.settings" . | trim) }}
    {{- $kv := regexSplit "=" . 2 }}
    - name: {{ printf "TETHER_%s" (index $kv 0 | upper | replace "-" "_") }}
      value: {{ index $kv 1 | quote }}
    {{- end }}
    {{- with .Values.proxy.httpsProxy }}
    - name: HTTPS_PROXY
      value: {{ . | quote }}
    {{- end }}
    {{- with .Values.proxy.noProxy }}
    - name: NO_PROXY
      value: {{ . | quote }}
    {{- end }}
  ports:
    - name: tether-health
      containerPort: {{ .Values.health.port }}
      protocol: TCP
  livenessProbe:
    httpGet:
      path: /healthz
      port: {{ .Values.health.port }}
    periodSeconds: {{ .Values.probes.liveness.periodSeconds }}
    failureThreshold: {{ .Values.probes.liveness.failureThreshold }}
  readinessProbe:
    httpGet:
      path: {{ include "tether-client.readinessPath" . }}
      port: {{ .Values.health.port }}
    periodSeconds: {{ .Values.probes.readiness.periodSeconds }}
    failureThreshold: {{ .Values.probes.readiness.failureThreshold }}
  securityContext:
    runAsNonRoot: true
    runAsUser: 65532
    runAsGroup: 65532
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities:
      drop: ["ALL"]
    seccompProfile:
      type: RuntimeDefault
  {{- with .Values.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    - name: tether-tmp
      mountPath: /tmp
    - name: tether-token
      mountPath: {{ include "tether-client.tokenDir" . }}
      readOnly: true
    {{- if or .Values.tls.caConfigMap .Values.tls.caSecret }}
    - name: tether-ca
      mountPath: {{ include "tether-client.caDir" . }}
      readOnly: true
    {{- end }}
{{- end }}

{{- define "tether-client.volumes" -}}
- name: tether-tmp
  emptyDir:
    sizeLimit: 64Mi
- name: tether-token
  secret:
    secretName: {{ include "tether-client.tokenSecretName" . }}
    items:
      - key: {{ .Values.token.secretKey }}
        path: {{ .Values.token.secretKey }}
{{- if .Values.tls.caConfigMap }}
- name: tether-ca
  configMap:
    name: {{ .Values.tls.caConfigMap }}
    items:
      - key: {{ .Values.tls.caKey }}
        path: {{ .Values.tls.caKey }}
{{- else if .Values.tls.caSecret }}
- name: tether-ca
  secret:
    secretName: {{ .Values.tls.caSecret }}
    items:
      - key: {{ .Values.tls.caKey }}
        path: {{ .Values.tls.caKey }}
{{- end }}
{{- end }}
