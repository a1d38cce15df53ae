{{/* The small objects around a controller's Deployment. */}}

{{- define "cairn.serviceAccount" -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ include "cairn.fullname" . }}
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "cairn.labels" . | nindent 4 }}
  {{- with .Values.serviceAccount.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}

{{- define "cairn.services" -}}
# /metrics, /livez and /readyz of every replica.
apiVersion: v1
kind: Service
metadata:
  name: {{ include "cairn.fullname" . }}-metrics
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "cairn.labels" . | nindent 4 }}
spec:
  selector:
    {{- include "cairn.selectorLabels" . | nindent 4 }}
  ports:
    - name: admin
      port: 8080
      targetPort: admin
{{- if .Values.webhook }}
---
# The webhook, served by every replica.
apiVersion: v1
kind: Service
metadata:
  name: {{ include "cairn.webhookService" . }}
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "cairn.labels" . | nindent 4 }}
spec:
  selector:
    {{- include "cairn.selectorLabels" . | nindent 4 }}
  ports:
    - name: webhook
      port: 443
      targetPort: webhook
{{- end }}
{{- end -}}

{{- define "cairn.podDisruptionBudget" -}}
{{- if and .Values.podDisruptionBudget.enabled (gt (int .Values.replicas) 1) }}
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "cairn.fullname" . }}
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "cairn.labels" . | nindent 4 }}
spec:
  maxUnavailable: 1
  selector:
    matchLabels:
      {{- include "cairn.selectorLabels" . | nindent 6 }}
{{- end }}
{{- end -}}

{{/* Only the admin port (probes, metrics) and the webhook port accept
connections; each from the peers its `…From` value lists, or from anywhere
when the list is empty (the kubelet's probes, the API server's webhook calls
and Prometheus come from addresses a chart cannot know). The chart's own
`helm test` pod may always reach the admin port. */}}
{{- define "cairn.networkPolicy" -}}
{{- if .Values.networkPolicy.enabled }}
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: {{ include "cairn.fullname" . }}
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "cairn.labels" . | nindent 4 }}
spec:
  podSelector:
    matchLabels:
      {{- include "cairn.selectorLabels" . | nindent 6 }}
  policyTypes: [Ingress]
  ingress:
    - ports:
        - port: admin
      {{- with .Values.networkPolicy.metricsFrom }}
      from:
        {{- toYaml . | nindent 8 }}
        - podSelector:
            matchLabels:
              {{- include "cairn.testLabels" $ | nindent 14 }}
      {{- end }}
    {{- if .Values.webhook }}
    - ports:
        - port: webhook
      {{- with .Values.networkPolicy.webhookFrom }}
      from:
        {{- toYaml . | nindent 8 }}
      {{- end }}
    {{- end }}
{{- end }}
{{- end -}}

{{- define "cairn.serviceMonitor" -}}
{{- if .Values.serviceMonitor.enabled }}
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata:
  name: {{ include "cairn.fullname" . }}
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "cairn.labels" . | nindent 4 }}
spec:
  selector:
    matchLabels:
      {{- include "cairn.selectorLabels" . | nindent 6 }}
  endpoints:
    - port: admin
      path: /metrics
      interval: {{ .Values.serviceMonitor.interval }}
      # A series about a user's object carries that object's namespace
      # (cairn_backup_schedule_healthy{namespace,schedule}): it wins over the
      # controller pod's, which the other series keep.
      honorLabels: true
{{- end }}
{{- end -}}

{{/* The alerts of the chart's rules/alerts.yaml (unit-tested there with
promtool); runbooks in docs/runbooks.md. */}}
{{- define "cairn.prometheusRule" -}}
{{- if .Values.prometheusRule.enabled }}
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: {{ include "cairn.fullname" . }}
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "cairn.labels" . | nindent 4 }}
    {{- with .Values.prometheusRule.labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  {{- .Files.Get "rules/alerts.yaml" | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "cairn.testLabels" -}}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: helm-test
{{- end -}}

{{/* `helm test`: the controller's own image, run with --probe, asks the
metrics Service for /readyz, which only a replica whose caches have synced
answers (the Service routes to ready replicas only). No API credentials. */}}
{{- define "cairn.testPod" -}}
apiVersion: v1
kind: Pod
metadata:
  name: {{ include "cairn.fullname" . }}-test-ready
  namespace: {{ .Release.Namespace }}
  # Not the controller's selector labels: its PDB, anti-affinity and
  # NetworkPolicy must not count this pod as a replica.
  labels:
    app.kubernetes.io/name: {{ include "cairn.name" . }}-test
    {{- include "cairn.testLabels" . | nindent 4 }}
    app.kubernetes.io/part-of: cairn
  annotations:
    helm.sh/hook: test
    helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded
spec:
  restartPolicy: Never
  automountServiceAccountToken: false
  securityContext:
    {{- include "cairn.podSecurityContext" . | nindent 4 }}
  {{- with include "cairn.placement" . }}{{ . | nindent 2 }}{{ end }}
  containers:
    - name: ready
      image: {{ include "cairn.image" . | quote }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      args:
        - --probe
        - http://{{ include "cairn.fullname" . }}-metrics.{{ .Release.Namespace }}.svc:8080/readyz
      resources:
        requests: {cpu: 10m, memory: 16Mi}
        limits: {memory: 32Mi}
      securityContext:
        {{- include "cairn.containerSecurityContext" . | nindent 8 }}
{{- end -}}

{{/* cert-manager issues the webhook's certificate (webhook.certificates.
certManager): from the given issuer, or from a CA the chart has cert-manager
make (a self-signed root, then a CA Issuer). The controller mounts the Secret,
reloads it when cert-manager renews it, and writes its ca.crt into the CRD. */}}
{{- define "cairn.webhookCertificate" -}}
{{- $cm := .Values.webhook.certificates.certManager -}}
{{- if and $cm.enabled (not .Values.webhook.certificates.secretName) }}
{{- $fullname := include "cairn.fullname" . -}}
{{- $issuer := $cm.issuerRef -}}
{{- if not $issuer }}
{{- $issuer = dict "name" (printf "%s-webhook-ca" $fullname) "kind" "Issuer" }}
apiVersion: cert-manager.io/v1
kind: Issuer
metadata:
  name: {{ $fullname }}-selfsigned
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "cairn.labels" . | nindent 4 }}
spec:
  selfSigned: {}
---
apiVersion: cert-manager.io/v1
kind: Certificate
metadata:
  name: {{ $fullname }}-webhook-ca
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "cairn.labels" . | nindent 4 }}
spec:
  isCA: true
  commonName: {{ $fullname }}-webhook-ca
  secretName: {{ $fullname }}-webhook-ca
  duration: 87600h
  privateKey:
    algorithm: ECDSA
    size: 256
  issuerRef:
    name: {{ $fullname }}-selfsigned
    kind: Issuer
---
apiVersion: cert-manager.io/v1
kind: Issuer
metadata:
  name: {{ $fullname }}-webhook-ca
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "cairn.labels" . | nindent 4 }}
spec:
  ca:
    secretName: {{ $fullname }}-webhook-ca
---
{{- end }}
apiVersion: cert-manager.io/v1
kind: Certificate
metadata:
  name: {{ $fullname }}-webhook
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "cairn.labels" . | nindent 4 }}
spec:
  secretName: {{ include "cairn.webhookCertSecret" . }}
  duration: {{ $cm.duration }}
  renewBefore: {{ $cm.renewBefore }}
  dnsNames:
    - {{ include "cairn.webhookService" . }}.{{ .Release.Namespace }}.svc
    - {{ include "cairn.webhookService" . }}.{{ .Release.Namespace }}.svc.cluster.local
  privateKey:
    algorithm: ECDSA
    size: 256
    rotationPolicy: Always
  issuerRef:
    {{- toYaml $issuer | nindent 4 }}
{{- end }}
{{- end -}}
