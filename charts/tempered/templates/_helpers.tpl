{{- /* Shared helpers of the chart: names, labels, the workers' merged values, their probes and
the workspace sessions' start. The settings (ConfigMap, Secret, the routes of TEMPERED_*
variables) are _settings.tpl's; the sandbox namespace's checks _sandbox.tpl's. */ -}}

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

{{- /* The agent-tasks worker's build id: temporal.buildId, or "" when the worker names its own
build, a digest of its workflow code (workers/versioning.py build_id): then an image bump that
leaves the workflows as they were keeps their build, and their running workflows. */ -}}
{{- define "tempered.buildId" -}}
{{- .Values.temporal.buildId -}}
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

{{/* A map without its null entries, as YAML: a null in `settings:` or `defaults.env` (which
nothing is merged over) removes the key, as a null in workers.<queue>.env does (deepMerge). */}}
{{- define "tempered.withoutNulls" -}}
{{- $kept := dict -}}
{{- range $key, $value := . | default dict -}}
{{- if not (kindIs "invalid" $value) -}}
{{- $_ := set $kept $key $value -}}
{{- end -}}
{{- end -}}
{{- toYaml $kept -}}
{{- end -}}

{{/* The effective values of worker .name: defaults merged with workers.<name>, as a dict (its
env without null entries). */}}
{{- define "tempered.worker" -}}
{{- $over := get .root.Values.workers .name | default dict -}}
{{- $merged := include "tempered.deepMerge" (dict "base" .root.Values.defaults "over" $over) | fromYaml -}}
{{- $_ := set $merged "env" (include "tempered.withoutNulls" $merged.env | fromYaml) -}}
{{- $_ := set $merged "name" .name -}}
{{- toYaml $merged -}}
{{- end -}}

{{/*
A value as the string an environment variable (`settings:`, a worker's `env:`) or KEDA's trigger
metadata holds. helm reads a values file's numbers as floats, which toString writes as "1e+06"
from a million up, and an int field refuses that: whole numbers are written as integers.
*/}}
{{- define "tempered.string" -}}
{{- if and (kindIs "float64" .) (eq . (floor .)) -}}
{{- printf "%.0f" . -}}
{{- else -}}
{{- toString . -}}
{{- end -}}
{{- end -}}

{{/* The settings that name the torch device of the workers that run torch on GPUs
(infra/settings.py: inference.local.device, learner.device). */}}
{{- define "tempered.deviceSettings" -}}
inference: TEMPERED_INFERENCE__LOCAL__DEVICE
learner: TEMPERED_LEARNER__DEVICE
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

{{/* <fullname>-<queue> in 63 characters: the fullname is shortened, never the queue, so the
workers' Deployments (and HPAs, ScaledObjects) keep names of their own under a long release name.
Shortened alike for every queue (to fit the longest, of tempered.portOffsets, all the queues), so
they keep one prefix, which no worker's values change. */}}
{{- define "tempered.workerName" -}}
{{- $longest := 0 -}}
{{- range $queue, $_ := include "tempered.portOffsets" .root | fromYaml -}}
{{- $longest = max $longest (len $queue) -}}
{{- end -}}
{{- $base := include "tempered.fullname" .root | trunc (int (sub 62 $longest)) | trimSuffix "-" -}}
{{- printf "%s-%s" $base .name -}}
{{- end -}}

{{/* Service accounts: workers get no API token; the sandbox worker's token may only touch the
sandbox namespace (see sandbox-rbac.yaml). */}}
{{- define "tempered.workerServiceAccount" -}}
{{- printf "%s-worker" (include "tempered.fullname" .) -}}
{{- end -}}

{{- define "tempered.sandboxServiceAccount" -}}
{{- printf "%s-sandbox" (include "tempered.fullname" .) -}}
{{- end -}}

{{/* The sandbox worker's Role in the release namespace: it may look up its fellow workers' pods. */}}
{{- define "tempered.sandboxReaper" -}}
{{- printf "%s-sandbox-reaper" (include "tempered.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Fails the release on a worker's scaling that the cluster would refuse or that breaks the worker
(.: its effective values, tempered.worker): the learner at more than one pod, by replicas, an
autoscaler or a rolling update's surge pod (one DeepSpeed engine owns its GPUs and publishes the
policy; a second would train beside it); an HPA's or KEDA's minimum above its maximum (the API
server, KEDA's webhook refuse them); an HPA without a target (no `metrics` scales on 80% CPU,
which no value said). The schema cannot compare two values.
*/}}
{{- define "tempered.checkScaling" -}}
{{- $w := . -}}
{{- if eq $w.name "learner" -}}
{{- $why := list -}}
{{- if gt (int $w.replicas) 1 -}}
{{- $why = append $why (printf "replicas is %d" (int $w.replicas)) -}}
{{- end -}}
{{- if $w.autoscaling.enabled -}}
{{- $why = append $why "autoscaling.enabled is true" -}}
{{- end -}}
{{- if $w.keda.enabled -}}
{{- $why = append $why "keda.enabled is true" -}}
{{- end -}}
{{- if ne (toString ($w.strategy | default dict).type) "Recreate" -}}
{{- $why = append $why (printf "strategy.type is %s" (toString ($w.strategy | default dict).type | default "unset (RollingUpdate)")) -}}
{{- end -}}
{{- if $why -}}
{{- fail (printf "workers.learner runs one pod at most (one DeepSpeed engine owns its GPUs; never two learners side by side), but %s (in workers.learner or from defaults): set workers.learner.replicas to 1 or 0, strategy.type to Recreate, and autoscaling.enabled and keda.enabled to false." (join ", " $why)) -}}
{{- end -}}
{{- end -}}
{{- if $w.keda.enabled -}}
{{- if gt (int $w.keda.minReplicas) (int $w.keda.maxReplicas) -}}
{{- fail (printf "workers.%s: keda.minReplicas %d is above keda.maxReplicas %d (KEDA refuses the ScaledObject)." $w.name (int $w.keda.minReplicas) (int $w.keda.maxReplicas)) -}}
{{- end -}}
{{- else if $w.autoscaling.enabled -}}
{{- if gt (int $w.autoscaling.minReplicas) (int $w.autoscaling.maxReplicas) -}}
{{- fail (printf "workers.%s: autoscaling.minReplicas %d is above autoscaling.maxReplicas %d (the API server refuses the HorizontalPodAutoscaler)." $w.name (int $w.autoscaling.minReplicas) (int $w.autoscaling.maxReplicas)) -}}
{{- end -}}
{{- if not (or (gt (int $w.autoscaling.targetCPUUtilizationPercentage) 0) (gt (int $w.autoscaling.targetMemoryUtilizationPercentage) 0)) -}}
{{- fail (printf "workers.%s: autoscaling has no target: set autoscaling.targetCPUUtilizationPercentage or targetMemoryUtilizationPercentage above 0 (an HPA without metrics scales on 80%% CPU)." $w.name) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Workspace sessions in the sandbox worker's pods (sandbox.workspaceSessions, README.md): where the
session directories live, where the pod's unmasked proc is mounted, and what the container runs
before the worker. bwrap, run by the worker under a sandbox uid, mounts a /proc of its own inside
a new user namespace; the kernel allows that only where a proc that nothing covers is mounted
already, and the runtime masks the container's /proc (Kubernetes unmasks it only for pods with
`hostUsers: false`). A `subset=pid` proc (this pod's processes, no /proc/sys, kcore or
sysrq-trigger) is enough. `bwrap --disable-userns` then writes its sandbox's
user.max_user_namespaces through /proc/sys/user, which is made writable alone (the rest of
/proc/sys stays read-only). Both need CAP_SYS_ADMIN and Linux 5.8 or later (subset=pid).
*/}}
{{- define "tempered.workspacesRoot" -}}/var/lib/tempered-workspaces{{- end -}}
{{- define "tempered.visibleProc" -}}/run/tempered/proc{{- end -}}
{{- define "tempered.workspaceSessionsStart" -}}
set -eu
fail() { echo "tempered sandbox.workspaceSessions: $*; see charts/tempered/README.md, Workspace sessions" >&2; exit 1; }
mount -t proc -o nosuid,nodev,noexec,subset=pid proc {{ include "tempered.visibleProc" . }} \
  || fail "cannot mount a proc on {{ include "tempered.visibleProc" . }} (it needs CAP_SYS_ADMIN, a seccomp and an AppArmor profile that allow mount(2), and Linux 5.8 or later)"
{ mount --bind /proc/sys/user /proc/sys/user \
  && mount -o remount,bind,rw,nosuid,nodev,noexec /proc/sys/user; } \
  || fail "cannot make /proc/sys/user writable for bwrap --disable-userns"
exec /usr/bin/tini -- tempered "$@"
{{- end -}}

{{/*
The exec command of a worker's health probe, on the files the worker writes in its state dir
(workers/health.py: HEALTH_DIR, STALE_S; sh and coreutils, as in the image). .check "alive"
(liveness): the alive file, which the worker's event loop touches every few seconds, is younger
than 60 s. "ready" (startup, readiness): alive, and the ready file, written once every Worker of
the process polls, holds this container's token, its PID 1's start time (/proc/1/stat's 22nd
field): the state dir is an emptyDir, which keeps the files of the pod's last container.
*/}}
{{- define "tempered.healthProbe" -}}
{{- $files := printf "%s/health/%s" .root.Values.stateDir .name -}}
{{- $alive := printf "test $(( $(date +%%s) - $(stat -c %%Y \"%s.alive\" 2>/dev/null || echo 0) )) -lt 60" $files -}}
{{- $token := "$(sed 's/.*) //' /proc/1/stat | cut -d ' ' -f 20)" -}}
{{- $ready := printf "test -f \"%s.ready\" && test \"$(cat \"%s.ready\")\" = \"%s\" && %s" $files $files $token $alive -}}
{{- list "sh" "-c" (ternary $ready $alive (eq .check "ready")) | toYaml -}}
{{- end -}}

{{/*
HOME and HF_HOME of a worker's container, in the state dir (an emptyDir; the root file system is
read-only): the image's (the Dockerfile's tempered user's home, HF_HOME) are in the default
stateDir only. Unless the worker's env names them. As YAML.
*/}}
{{- define "tempered.stateDirEnv" -}}
HOME: {{ .Values.stateDir | quote }}
HF_HOME: {{ printf "%s/hf" .Values.stateDir | quote }}
{{- end -}}
