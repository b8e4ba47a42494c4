{{- /* The settings the chart hands the workers as TEMPERED_* variables: the ConfigMap's and the
Secret's content and their names (a digest of it), the settings the chart writes itself, and the
one rule on both routes by which values add variables of their own: `settings:` (the ConfigMap)
and a worker's `env:` (workers.<queue>.env over defaults.env, the container's env, which wins
over the ConfigMap). */ -}}

{{/* `settings:` without its null entries (a null removes the key), as YAML. */}}
{{- define "tempered.settings" -}}
{{- include "tempered.withoutNulls" .Values.settings -}}
{{- end -}}

{{/* The settings ConfigMap's data (settings-configmap.yaml), as YAML: the settings model
(infra/settings.py) as TEMPERED_* variables, shared by every worker. */}}
{{- define "tempered.settingsData" -}}
TEMPERED_HOME: {{ .Values.stateDir | quote }}
TEMPERED_TEMPORAL__ADDRESS: {{ required "temporal.address is required" .Values.temporal.address | quote }}
TEMPERED_TEMPORAL__NAMESPACE: {{ .Values.temporal.namespace | quote }}
TEMPERED_TEMPORAL__VERSIONING: {{ .Values.temporal.versioning | quote }}
TEMPERED_TEMPORAL__DEPLOYMENT: {{ .Values.temporal.deployment | quote }}
{{- with include "tempered.buildId" . }}
TEMPERED_TEMPORAL__BUILD_ID: {{ . | quote }}
{{- end }}
TEMPERED_TEMPORAL__PROMOTE: {{ .Values.temporal.promote | quote }}
TEMPERED_S3__ENDPOINT: {{ .Values.s3.endpoint | quote }}
TEMPERED_S3__REGION: {{ .Values.s3.region | quote }}
TEMPERED_S3__BUCKET: {{ .Values.s3.bucket | quote }}
TEMPERED_SANDBOX__BACKEND: {{ .Values.sandbox.backend | quote }}
TEMPERED_SANDBOX__CONCURRENCY: {{ .Values.sandbox.concurrency | quote }}
TEMPERED_SANDBOX__KUBERNETES__NAMESPACE: {{ .Values.sandbox.namespace | quote }}
TEMPERED_SANDBOX__KUBERNETES__IMAGE: {{ .Values.sandbox.image | quote }}
{{- with .Values.sandbox.runtimeClass.name }}
TEMPERED_SANDBOX__KUBERNETES__RUNTIME_CLASS: {{ . | quote }}
{{- end }}
{{- with .Values.telemetry.otlpEndpoint }}
TEMPERED_TELEMETRY__OTLP_ENDPOINT: {{ . | quote }}
{{- end }}
{{- if .Values.telemetry.prometheus.enabled }}
TEMPERED_TELEMETRY__PROMETHEUS_PORT: {{ .Values.telemetry.prometheus.basePort | quote }}
TEMPERED_TELEMETRY__PROMETHEUS_HOST: {{ .Values.telemetry.prometheus.host | quote }}
{{- end }}
{{- range $key, $value := include "tempered.settings" . | fromYaml }}
{{ $key }}: {{ include "tempered.string" $value | quote }}
{{- end }}
{{- end -}}

{{/* The chart's S3 Secret's stringData (settings-secret.yaml), as YAML. */}}
{{- define "tempered.secretData" -}}
TEMPERED_S3__ACCESS_KEY: {{ required "s3.accessKey is required (or s3.existingSecret)" .Values.s3.accessKey | quote }}
TEMPERED_S3__SECRET_KEY: {{ required "s3.secretKey is required (or s3.existingSecret)" .Values.s3.secretKey | quote }}
{{- end -}}

{{/*
The ConfigMap's and the chart's Secret's names: <fullname>-settings-<digest>, <fullname>-s3-<digest>,
the digest the first 10 hex digits of the SHA-256 of the content. The Deployments name them, so
changed settings are a new ConfigMap and a new ReplicaSet of every worker, and each ReplicaSet's
pods keep the settings they started with: a pod of the old one whose container restarts during
the rollout never loads the new ones (which its build may not know: the settings model refuses
an unknown name). Both are immutable. Helm deletes the previous ones when it applies the
upgrade (README.md, "Settings through a rollout"). s3.existingSecret keeps its own name.
*/}}
{{- define "tempered.settingsName" -}}
{{- printf "%s-settings-%s" (include "tempered.fullname" .) (include "tempered.settingsData" . | sha256sum | trunc 10) -}}
{{- end -}}

{{- define "tempered.secretName" -}}
{{- if .Values.s3.existingSecret -}}
{{- .Values.s3.existingSecret -}}
{{- else -}}
{{- printf "%s-s3-%s" (include "tempered.fullname" .) (include "tempered.secretData" . | sha256sum | trunc 10) -}}
{{- end -}}
{{- end -}}

{{/*
The TEMPERED_* names the chart writes itself (tempered.settingsData, tempered.secretData, a
worker container's env: the learner's ranks, each pod's worker id, the workspace sessions'
root and disk), each with what to set instead (the refusal's words); tests/charts/
test_chart_env_routes.py checks that every name those render is here. A `settings:` entry of
one would be written twice, and the ConfigMap's later key would win; a worker's `env:` entry
wins over the ConfigMap, and names the container's variable twice (which one wins is the
client's). Either would pass what the chart derives from the value: the sandbox quota check
(concurrency), the sandbox namespace and its RBAC, the state dir's mount, the metrics ports,
the sessions' volumes, the worker id by which sessions are routed (one per pod).
*/}}
{{- define "tempered.chartSettings" -}}
TEMPERED_HOME: set stateDir instead
TEMPERED_TEMPORAL__ADDRESS: set temporal.address instead
TEMPERED_TEMPORAL__NAMESPACE: set temporal.namespace instead
TEMPERED_TEMPORAL__VERSIONING: set temporal.versioning instead
TEMPERED_TEMPORAL__DEPLOYMENT: set temporal.deployment instead
TEMPERED_TEMPORAL__BUILD_ID: set temporal.buildId instead
TEMPERED_TEMPORAL__PROMOTE: set temporal.promote instead
TEMPERED_S3__ENDPOINT: set s3.endpoint instead
TEMPERED_S3__REGION: set s3.region instead
TEMPERED_S3__BUCKET: set s3.bucket instead
TEMPERED_S3__ACCESS_KEY: set s3.accessKey or s3.existingSecret instead
TEMPERED_S3__SECRET_KEY: set s3.secretKey or s3.existingSecret instead
TEMPERED_SANDBOX__BACKEND: set sandbox.backend instead
TEMPERED_SANDBOX__CONCURRENCY: set sandbox.concurrency instead
TEMPERED_SANDBOX__KUBERNETES__NAMESPACE: set sandbox.namespace instead
TEMPERED_SANDBOX__KUBERNETES__IMAGE: set sandbox.image instead
TEMPERED_SANDBOX__KUBERNETES__RUNTIME_CLASS: set sandbox.runtimeClass.name instead
TEMPERED_TELEMETRY__OTLP_ENDPOINT: set telemetry.otlpEndpoint instead
TEMPERED_TELEMETRY__PROMETHEUS_PORT: set telemetry.prometheus.basePort (with telemetry.prometheus.enabled) instead
TEMPERED_TELEMETRY__PROMETHEUS_HOST: set telemetry.prometheus.host instead
TEMPERED_LEARNER__RANKS: set workers.learner.gpu or workers.learner.env instead
TEMPERED_WORKER_ID: "each pod's own name (no two pods may share one): remove the entry"
TEMPERED_SANDBOX__WORKSPACES__ROOT: the chart sets it with sandbox.workspaceSessions.enabled (the sessions' emptyDir, sized by .sizeLimit)
TEMPERED_SANDBOX__WORKSPACES__DISK: set sandbox.workspaceSessions.disk instead (tmpfs or directory; the chart writes it with .enabled)
{{- end -}}

{{/* Of tempered.chartSettings, those the chart leaves to a worker's own env (it writes them
only where that env does not, workers-deployment.yaml), by worker. */}}
{{- define "tempered.workerEnvSettings" -}}
learner: [TEMPERED_LEARNER__RANKS]
{{- end -}}

{{/*
The one rule of both routes: fails the release when one names a setting of
tempered.chartSettings. .routes: a list of dicts of "route" (as the message names it: settings,
workers.<queue>.env, defaults.env) and "names" (the TEMPERED_* names it sets); .exempt: the
names the chart leaves to that worker (tempered.workerEnvSettings); .root: the chart's context.
*/}}
{{- define "tempered.refuseChartSettings" -}}
{{- $owned := include "tempered.chartSettings" .root | fromYaml -}}
{{- $exempt := .exempt | default list -}}
{{- $taken := list -}}
{{- range $route := .routes -}}
{{- range $key := $route.names | sortAlpha -}}
{{- if and (hasKey $owned $key) (not (has $key $exempt)) -}}
{{- $taken = append $taken (printf "%s.%s is written by the chart: %s" $route.route $key (get $owned $key)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if $taken -}}
{{- fail (printf "%s (an entry there would override what the chart derives from its own value)." (join "; " $taken)) -}}
{{- end -}}
{{- end -}}

{{/* The `settings:` route (settings-configmap.yaml). */}}
{{- define "tempered.checkSettings" -}}
{{- $route := dict "route" "settings" "names" (keys (include "tempered.settings" . | fromYaml)) -}}
{{- include "tempered.refuseChartSettings" (dict "root" . "routes" (list $route)) -}}
{{- end -}}

{{/* The `env:` route of worker .w (its effective values, tempered.worker; workers-deployment.yaml):
each name of its env, by where it comes from, its own workers.<queue>.env or defaults.env. */}}
{{- define "tempered.checkWorkerEnv" -}}
{{- $own := (get .root.Values.workers .w.name | default dict).env | default dict -}}
{{- $mine := list -}}
{{- $inherited := list -}}
{{- range $key, $_ := .w.env | default dict -}}
{{- if hasKey $own $key -}}
{{- $mine = append $mine $key -}}
{{- else -}}
{{- $inherited = append $inherited $key -}}
{{- end -}}
{{- end -}}
{{- $routes := list (dict "route" (printf "workers.%s.env" .w.name) "names" $mine) (dict "route" "defaults.env" "names" $inherited) -}}
{{- $exempt := get (include "tempered.workerEnvSettings" .root | fromYaml) .w.name | default list -}}
{{- include "tempered.refuseChartSettings" (dict "root" .root "routes" $routes "exempt" $exempt) -}}
{{- end -}}
