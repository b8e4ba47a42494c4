{{- /* Workspace sessions' sizing (sandbox.workspaceSessions): the check that the sandbox
worker's pod, which holds every command of its sessions, has the memory for them. */ -}}

{{/* What the sum below takes where neither the sandbox worker's env nor `settings:` sets it: the
settings model's defaults (infra/settings.py WorkspaceSettings) and a run's default tmpfs_mb
(contracts/task.py SandboxLimits: a run's own limit, no setting); tests/charts/
test_chart_fix60_sessions_memory.py compares them with the model. */}}
{{- define "tempered.workspaceDefaults" -}}
TEMPERED_SANDBOX__WORKSPACES__MAX_TASK_MEMORY_MB: 4096
TEMPERED_SANDBOX__WORKSPACES__MAX_WORKSPACE_MB: 256
tmpfs_mb: 64
{{- end -}}

{{/* The sandbox worker's setting .name as a number and where it came from, as YAML: its env
(.w.env: workers.sandbox.env over defaults.env, which wins in the pod), else `settings:`, else
tempered.workspaceDefaults. .root: the chart's context. */}}
{{- define "tempered.sessionSetting" -}}
{{- $settings := include "tempered.settings" .root | fromYaml -}}
{{- $value := get (include "tempered.workspaceDefaults" .root | fromYaml) .name -}}
{{- $from := "the settings model's default" -}}
{{- if hasKey $settings .name -}}
{{- $value = get $settings .name -}}
{{- $from = printf "settings.%s" .name -}}
{{- end -}}
{{- if hasKey (.w.env | default dict) .name -}}
{{- $value = get .w.env .name -}}
{{- $from = printf "the sandbox worker's env %s" .name -}}
{{- end -}}
value: {{ atoi (include "tempered.string" $value) }}
from: {{ $from | quote }}
{{- end -}}

{{/*
Fails the release when the sandbox worker serves workspace sessions (.w: its effective values,
tempered.worker) and its container's memory limit cannot hold its commands at once: bwrap runs
them in this pod, up to sandbox.concurrency at a time (sessions' opens, steps and checks share
that limit, workers/sandbox.py), each up to max_task_memory_mb (RLIMIT_AS), its /tmp and
/dev/shm tmpfs of a run's tmpfs_mb each, and its session's workspace, a tmpfs of
max_workspace_mb with disk tmpfs (a directory of the emptyDir with disk directory, not memory).
Not counted: the worker's own memory, sessions held beyond those whose commands run (each one's
workspace tmpfs counts while it is open) and runs whose tmpfs_mb is above the default. No
limit: nothing to size (the node bounds the pod). A limit in a form tempered.byteQuantity does
not read is not checked.
*/}}
{{- define "tempered.checkSessionsMemory" -}}
{{- $limit := "" -}}
{{- $limits := (.w.resources | default dict).limits | default dict -}}
{{- if hasKey $limits "memory" -}}
{{- $limit = include "tempered.byteQuantity" $limits.memory -}}
{{- end -}}
{{- if $limit -}}
{{- $task := include "tempered.sessionSetting" (dict "root" .root "w" .w "name" "TEMPERED_SANDBOX__WORKSPACES__MAX_TASK_MEMORY_MB") | fromYaml -}}
{{- $workspace := include "tempered.sessionSetting" (dict "root" .root "w" .w "name" "TEMPERED_SANDBOX__WORKSPACES__MAX_WORKSPACE_MB") | fromYaml -}}
{{- $tmpfs := int64 (get (include "tempered.workspaceDefaults" .root | fromYaml) "tmpfs_mb") -}}
{{- $disk := .root.Values.sandbox.workspaceSessions.disk | default "tmpfs" -}}
{{- $concurrency := int64 .root.Values.sandbox.concurrency -}}
{{- $inMemory := ternary (int64 $workspace.value) (int64 0) (eq $disk "tmpfs") -}}
{{- $each := add (int64 $task.value) (mul 2 $tmpfs) $inMemory -}}
{{- $needed := mul $concurrency $each -}}
{{- if lt (int64 $limit) (mul $needed 1048576) -}}
{{- $workspaceText := ternary (printf " + max_workspace_mb %d (%s; a tmpfs each, sandbox.workspaceSessions.disk tmpfs)" (int64 $workspace.value) $workspace.from) "" (eq $disk "tmpfs") -}}
{{- fail (printf "sandbox.workspaceSessions: the sandbox worker's memory limit, workers.sandbox.resources.limits.memory %v, cannot hold the workspace commands it runs at once in its pod: sandbox.concurrency %d x (max_task_memory_mb %d (%s) + 2 x tmpfs_mb %d (their /tmp and /dev/shm, a run's default limit)%s) = %dMi (%s). Raise workers.sandbox.resources.limits.memory to at least that, or lower sandbox.concurrency or TEMPERED_SANDBOX__WORKSPACES__MAX_TASK_MEMORY_MB or __MAX_WORKSPACE_MB (in workers.sandbox.env, or settings); see \"Workspace sessions\" in the chart's README." $limits.memory $concurrency (int64 $task.value) $task.from $tmpfs $workspaceText $needed (include "tempered.bytesText" (mul $needed 1048576))) -}}
{{- end -}}
{{- end -}}
{{- end -}}
