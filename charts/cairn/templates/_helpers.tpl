{{/* The database subchart's webhook Service, named as the subchart names it
(cairn.fullname with the subchart's values and its alias as chart name): the
DatabaseCluster CRD this chart installs converts through it. */}}
{{- define "cairn-umbrella.databaseWebhookService" -}}
{{- $subchart := dict "Values" .Values.database "Release" .Release "Chart" (dict "Name" "database") -}}
{{- include "cairn.webhookService" $subchart -}}
{{- end -}}
