{{/* The controller's Deployment: leader-elected replicas, restricted pod
security, read-only root, the runtime's settings from values. A chart with a
`webhook` value also serves its webhook from every replica. */}}
{{- define "cairn.deployment" -}}
{{- $certs := include "cairn.webhookCertSecret" . -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "cairn.fullname" . }}
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "cairn.labels" . | nindent 4 }}
spec:
  replicas: {{ .Values.replicas }}
  selector:
    matchLabels:
      {{- include "cairn.selectorLabels" . | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "cairn.labels" . | nindent 8 }}
        {{- with .Values.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- with .Values.podAnnotations }}
      annotations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
    spec:
      serviceAccountName: {{ include "cairn.fullname" . }}
      # After SIGTERM the leader lets in-flight reconciles finish for
      # runtime.shutdownGraceSeconds, then releases the lease; the kubelet
      # waits 10 s longer before it kills.
      terminationGracePeriodSeconds: {{ add .Values.runtime.shutdownGraceSeconds 10 }}
      securityContext:
        {{- include "cairn.podSecurityContext" . | nindent 8 }}
      {{- with include "cairn.placement" . }}{{ . | nindent 6 }}{{ end }}
      {{- if .Values.affinity }}
      affinity:
        {{- toYaml .Values.affinity | nindent 8 }}
      {{- else }}
      affinity:
        podAntiAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
            - weight: 100
              podAffinityTerm:
                topologyKey: kubernetes.io/hostname
                labelSelector:
                  matchLabels:
                    {{- include "cairn.selectorLabels" . | nindent 20 }}
      {{- end }}
      {{- with .Values.topologySpreadConstraints }}
      {{- $selector := dict "labelSelector" (dict "matchLabels" (include "cairn.selectorLabels" $ | fromYaml)) }}
      {{- $constraints := list }}
      {{- range . }}{{ $constraints = append $constraints (merge (deepCopy .) $selector) }}{{ end }}
      topologySpreadConstraints:
        {{- toYaml $constraints | nindent 8 }}
      {{- end }}
      containers:
        - name: controller
          image: {{ include "cairn.image" . | quote }}
          imagePullPolicy: {{ .Values.image.pullPolicy }}
          env:
            - name: POD_NAME
              valueFrom:
                fieldRef:
                  fieldPath: metadata.name
            - name: POD_NAMESPACE
              valueFrom:
                fieldRef:
                  fieldPath: metadata.namespace
            - name: CAIRN_NAMESPACES
              value: {{ .Values.watchNamespace | quote }}
            - name: CAIRN_ADMIN_ADDRESS
              value: "0.0.0.0:8080"
            {{- with .Values.webhook }}
            - name: CAIRN_WEBHOOK_ADDRESS
              value: "0.0.0.0:{{ .port }}"
            - name: CAIRN_WEBHOOK_SERVICE
              value: "{{ include "cairn.webhookService" $ }}.{{ $.Release.Namespace }}.svc"
            {{- if $certs }}
            - name: CAIRN_WEBHOOK_CERT_DIR
              value: /certs
            {{- end }}
            {{- end }}
            - name: CAIRN_LOG_FORMAT
              value: {{ .Values.logFormat }}
            - name: CAIRN_LOG_LEVEL
              value: {{ .Values.logLevel | quote }}
            - name: CAIRN_CONCURRENCY
              value: {{ .Values.concurrency | quote }}
            {{- with .Values.runtime }}
            - name: CAIRN_RESYNC_SECONDS
              value: {{ .resyncSeconds | quote }}
            - name: CAIRN_BACKOFF_INITIAL_SECONDS
              value: {{ .backoffInitialSeconds | quote }}
            - name: CAIRN_BACKOFF_MAX_SECONDS
              value: {{ .backoffMaxSeconds | quote }}
            - name: CAIRN_WATCH_FAILURE_LIMIT_SECONDS
              value: {{ .watchFailureLimitSeconds | quote }}
            - name: CAIRN_SHUTDOWN_GRACE_SECONDS
              value: {{ .shutdownGraceSeconds | quote }}
            {{- end }}
            {{- with .Values.otlpEndpoint }}
            - name: OTEL_EXPORTER_OTLP_ENDPOINT
              value: {{ . | quote }}
            {{- end }}
            {{- with .Values.extraEnv }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          ports:
            - name: admin
              containerPort: 8080
            {{- with .Values.webhook }}
            - name: webhook
              containerPort: {{ .port }}
            {{- end }}
          livenessProbe:
            httpGet:
              path: /livez
              port: admin
            periodSeconds: 10
            failureThreshold: 3
          readinessProbe:
            httpGet:
              path: /readyz
              port: admin
            periodSeconds: 5
          resources:
            {{- toYaml .Values.resources | nindent 12 }}
          securityContext:
            {{- include "cairn.containerSecurityContext" . | nindent 12 }}
          {{- if $certs }}
          volumeMounts:
            - name: certs
              mountPath: /certs
              readOnly: true
      volumes:
        - name: certs
          secret:
            secretName: {{ $certs }}
          {{- end }}
{{- end -}}
