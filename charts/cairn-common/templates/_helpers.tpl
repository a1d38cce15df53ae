{{/*
Names, labels and image of a controller chart. Every Cairn controller chart
includes these with its own context (`.`), so `.Chart`, `.Values` and `.Files`
are the controller chart's.
*/}}

{{/* The chart's own name. Under an alias (the umbrella chart's `database`,
`backup`, `cloud`) Helm renames `.Chart.Name`; the chart's annotation
`cairn.dev/chart` keeps it, so the labels say the same in either install. */}}
{{- define "cairn.chartName" -}}
{{- index (.Chart.Annotations | default dict) "cairn.dev/chart" | default .Chart.Name -}}
{{- end -}}

{{/* `app.kubernetes.io/name`. */}}
{{- define "cairn.name" -}}
{{- .Values.nameOverride | default (include "cairn.chartName" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Object names: after the alias under the umbrella chart (`cairn-database`
for release `cairn`), as they have always been. */}}
{{- define "cairn.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := .Values.nameOverride | default .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "cairn.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cairn.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "cairn.labels" -}}
{{ include "cairn.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: cairn
helm.sh/chart: {{ printf "%s-%s" (include "cairn.chartName" .) .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* registry/repository:tag, pinned by @digest when one is given. A
repository that names its registry itself (its first part has a dot, a colon
or is localhost: `registry.example.com/team/db`, as values before `registry`
existed said) is used as it is. */}}
{{- define "cairn.image" -}}
{{- $image := .Values.image -}}
{{- $name := $image.repository -}}
{{- $first := first (splitList "/" $name) -}}
{{- $named := and (contains "/" $name) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) -}}
{{- if and $image.registry (not $named) }}{{ $name = printf "%s/%s" $image.registry $name }}{{ end -}}
{{- $name = printf "%s:%s" $name ($image.tag | default .Chart.AppVersion) -}}
{{- with $image.digest }}{{ $name = printf "%s@%s" $name . }}{{ end -}}
{{- $name -}}
{{- end -}}

{{- define "cairn.webhookService" -}}
{{ include "cairn.fullname" . }}-webhook
{{- end -}}

{{/* The Secret the webhook's certificate is mounted from: the user's, or
the one cert-manager issues; empty when the controller manages its own. */}}
{{- define "cairn.webhookCertSecret" -}}
{{- with .Values.webhook -}}
{{- if .certificates.secretName -}}
{{- .certificates.secretName -}}
{{- else if (.certificates.certManager | default dict).enabled -}}
{{- include "cairn.fullname" $ }}-webhook-tls
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Non-empty when this release installs the CRDs of API group
`(list . GROUP)`: `crds.install` is set and, in the cairn umbrella chart
(whose values hold its controller subcharts under `database`, `backup` and
`cloud`), the group's controller is enabled: a disabled controller's CRDs may
belong to another release. */}}
{{- define "cairn.crds.install" -}}
{{- $ := index . 0 -}}
{{- $subchart := index (dict "database.cairn.dev" "database" "backup.cairn.dev" "backup" "cloud.cairn.dev" "cloud") (index . 1) -}}
{{- $controller := index $.Values $subchart | default dict -}}
{{- if and ($.Values.crds | default dict).install (ne (toString $controller.enabled) "false") -}}true{{- end -}}
{{- end -}}

{{- define "cairn.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "cairn.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end -}}

{{/* Where the controller's pods may run: shared by its Deployment and its
`helm test` pod (which runs the same image, so it must find it too). */}}
{{- define "cairn.placement" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
