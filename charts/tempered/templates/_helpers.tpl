{{/* Name of the chart, overridable. */}}
{{- define "tempered.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Release-qualified name: <release>-tempered, or the release name when it already says so. */}}
{{- define "tempered.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "tempered.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "tempered.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tempered.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tempered.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tempered.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "tempered.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- /* The agent-tasks worker's build id: temporal.buildId, else the image tag. */ -}}
{{- define "tempered.buildId" -}}
{{- .Values.temporal.buildId | default (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "tempered.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/*
Deep merge of two maps given as (dict "base" B "over" O), returned as YAML: maps merge key by
key, null in O removes the key, anything else in O replaces B's value, including false, 0 and
"". (Sprig's merge and mergeOverwrite skip "empty" values: `autoscaling: {enabled: false}`
would not stick.)
*/}}
{{- define "tempered.deepMerge" -}}
{{- $merged := deepCopy .base -}}
{{- range $key, $value := .over -}}
{{- $current := get $merged $key -}}
{{- if kindIs "invalid" $value -}}
{{- $_ := unset $merged $key -}}
{{- else if and (kindIs "map" $value) (kindIs "map" $current) -}}
{{- $_ := set $merged $key (include "tempered.deepMerge" (dict "base" $current "over" $value) | fromYaml) -}}
{{- else -}}
{{- $_ := set $merged $key $value -}}
{{- end -}}
{{- end -}}
{{- toYaml $merged -}}
{{- end -}}

{{/* The effective values of worker .name: defaults merged with workers.<name>, as a dict. */}}
{{- define "tempered.worker" -}}
{{- $over := get .root.Values.workers .name | default dict -}}
{{- $merged := include "tempered.deepMerge" (dict "base" .root.Values.defaults "over" $over) | fromYaml -}}
{{- $_ := set $merged "name" .name -}}
{{- $_ := set $merged "queue" (default .name $merged.queue) -}}
{{- toYaml $merged -}}
{{- end -}}

{{/* Prometheus port offset of each task queue (infra/telemetry.py PORT_OFFSETS). */}}
{{- define "tempered.portOffsets" -}}
agent-tasks: 0
inference: 1
sandbox: 2
rewards: 3
learner: 4
{{- end -}}

{{/* Metrics port of worker .name, or "" when Prometheus is off or the queue has no offset. */}}
{{- define "tempered.metricsPort" -}}
{{- $offsets := include "tempered.portOffsets" . | fromYaml -}}
{{- if and .root.Values.telemetry.prometheus.enabled (hasKey $offsets .name) -}}
{{- add (int .root.Values.telemetry.prometheus.basePort) (int (get $offsets .name)) -}}
{{- end -}}
{{- end -}}

{{- define "tempered.workerLabels" -}}
{{ include "tempered.selectorLabels" .root }}
app.kubernetes.io/component: worker
tempered.dev/queue: {{ .name }}
{{- end -}}

{{- define "tempered.workerName" -}}
{{- printf "%s-%s" (include "tempered.fullname" .root) .name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tempered.settingsName" -}}
{{- printf "%s-settings" (include "tempered.fullname" .) -}}
{{- end -}}

{{- define "tempered.secretName" -}}
{{- default (printf "%s-s3" (include "tempered.fullname" .)) .Values.s3.existingSecret -}}
{{- end -}}

{{/* Service accounts: workers get no API token; the sandbox worker's token may only touch the
sandbox namespace (see sandbox-rbac.yaml). */}}
{{- define "tempered.workerServiceAccount" -}}
{{- printf "%s-worker" (include "tempered.fullname" .) -}}
{{- end -}}

{{- define "tempered.sandboxServiceAccount" -}}
{{- printf "%s-sandbox" (include "tempered.fullname" .) -}}
{{- end -}}

{{- define "tempered.kubernetesSandbox" -}}
{{- if eq .Values.sandbox.backend "kubernetes" -}}true{{- end -}}
{{- end -}}

{{/* Labels of sandbox pods (infra/sandbox/kubernetes.py SANDBOX_LABELS). */}}
{{- define "tempered.sandboxPodLabels" -}}
app.kubernetes.io/component: sandbox
tempered.dev/sandbox: "true"
{{- end -}}
