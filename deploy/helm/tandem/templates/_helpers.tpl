{{/* Names and labels. */}}
{{- define "tandem.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tandem.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tandem.labels" -}}
{{ include "tandem.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Ray pods of this release carry this label: ray-head or ray-worker. */}}
{{- define "tandem.componentKey" -}}app.kubernetes.io/component{{- end -}}
{{- define "tandem.poolKey" -}}tandem.io/pool{{- end -}}

{{/* The Ray custom resource a pool's worker group advertises and its replicas ask for. */}}
{{- define "tandem.poolResource" -}}tandem-pool-{{ . }}{{- end -}}

{{/* Redis URL the chart provides ("" when none). */}}
{{- define "tandem.redisUrl" -}}
{{- if .Values.redis.builtin -}}
redis://{{ include "tandem.fullname" . }}-redis:6379/0
{{- else -}}
{{- .Values.redis.url -}}
{{- end -}}
{{- end -}}

{{/*
Pools of the ClusterConfig as a list of {tier, role, name}, one per worker group.
*/}}
{{- define "tandem.pools" -}}
{{- $pools := list -}}
{{- range $tier, $_ := .Values.cluster.tiers -}}
{{- range $role := list "prefill" "decode" -}}
{{- $pools = append $pools (dict "tier" $tier "role" $role "name" (printf "%s-%s" $tier $role)) -}}
{{- end -}}
{{- end -}}
{{- toJson $pools -}}
{{- end -}}

{{/*
Worker group settings of one pool: workers.defaults overlaid by workers.pools.<name>.
*/}}
{{- define "tandem.workerGroup" -}}
{{- $override := get (.root.Values.workers.pools | default dict) .name | default dict -}}
{{- toJson (mergeOverwrite (deepCopy .root.Values.workers.defaults) (deepCopy $override)) -}}
{{- end -}}

{{/*
The ClusterConfig handed to cluster.serve_entry:build: .Values.cluster with what the chart
provides filled in where the user left it unset (see values.yaml).
*/}}
{{- define "tandem.clusterConfig" -}}
{{- $cfg := deepCopy .Values.cluster -}}
{{- if not $cfg.default_tier -}}
{{- fail "cluster.default_tier is required: Helm does not keep the order of cluster.tiers" -}}
{{- end -}}
{{- $gateway := $cfg.gateway | default dict -}}
{{- $_ := set $gateway "host" "0.0.0.0" -}}
{{- $_ := set $gateway "port" .Values.service.targetPort -}}
{{- $_ := set $cfg "gateway" $gateway -}}
{{- $kv := $cfg.kv_transfer | default dict -}}
{{- if not $kv.side_channel_host -}}{{- $_ := set $kv "side_channel_host" "auto" -}}{{- end -}}
{{- $_ := set $cfg "kv_transfer" $kv -}}
{{- range $tier, $t := $cfg.tiers -}}
{{- $t = $t | default dict -}}
{{- range $role := list "prefill" "decode" -}}
{{- $pool := get $t $role | default dict -}}
{{- if not $pool.placement -}}
{{- $_ := set $pool "placement" (dict "resources" (dict (include "tandem.poolResource" (printf "%s-%s" $tier $role)) 1)) -}}
{{- end -}}
{{- /* Helm drops a null value, so `kv_cache_memory_bytes: null` cannot be written here: an engine
with gpu_memory_utilization and no kv_cache_memory_bytes gets the null (KV cache sized by it). */ -}}
{{- $engine := $pool.engine | default dict -}}
{{- if and (hasKey $engine "gpu_memory_utilization") (not (hasKey $engine "kv_cache_memory_bytes")) -}}
{{- $_ := set $engine "kv_cache_memory_bytes" nil -}}
{{- $_ := set $pool "engine" $engine -}}
{{- end -}}
{{- $_ := set $t $role $pool -}}
{{- end -}}
{{- $_ := set $cfg.tiers $tier $t -}}
{{- end -}}
{{- $routing := $cfg.routing | default dict -}}
{{- $index := $routing.index | default dict -}}
{{- if eq ($index.backend | default "memory") "redis" -}}
{{- if not $index.redis_url -}}
{{- $url := include "tandem.redisUrl" . -}}
{{- if not $url -}}
{{- fail "cluster.routing.index.backend is redis: set redis.builtin=true or redis.url" -}}
{{- end -}}
{{- $_ := set $index "redis_url" $url -}}
{{- end -}}
{{- if and (include "tandem.redisPasswordSecret" .) (not $index.redis_password) (not $index.redis_password_env) -}}
{{- $_ := set $index "redis_password_env" "TANDEM_REDIS_PASSWORD" -}}
{{- end -}}
{{- $_ := set $routing "index" $index -}}
{{- $_ := set $cfg "routing" $routing -}}
{{- end -}}
{{- with .Values.monitoring.tracing.otlpEndpoint -}}
{{- /* monitoring.tracing: tracing on, to this receiver, unless cluster.observability.tracing says otherwise */ -}}
{{- $obs := $cfg.observability | default dict -}}
{{- $tracing := $obs.tracing | default dict -}}
{{- if not $tracing.endpoint -}}{{- $_ := set $tracing "endpoint" . -}}{{- end -}}
{{- if not (hasKey $tracing "enabled") -}}{{- $_ := set $tracing "enabled" true -}}{{- end -}}
{{- if not $tracing.protocol -}}{{- $_ := set $tracing "protocol" $.Values.monitoring.tracing.protocol -}}{{- end -}}
{{- $_ := set $obs "tracing" $tracing -}}
{{- $_ := set $cfg "observability" $obs -}}
{{- end -}}
{{- toJson $cfg -}}
{{- end -}}

{{/*
How long KubeRay keeps the old RayCluster once a new one has taken the traffic (an upgrade that
changes rayClusterConfig, upgradeStrategy NewCluster): KubeRay deletes it, cutting what it still
serves, rayClusterDeletionDelaySeconds after the switch (default 60 s). The longest a request the
old gateway holds may still run is the gateway's drain, as tandem computes it for a redeploy:
the longest drain_timeout_s of any pool. A twin of cluster/app.py gateway_drain_s, drain_timeout_s,
MIN_DRAIN_S and PREFILL_LEASE_S (kv_transfer/handoff.py KV_LEASE_S - LEASE_MARGIN_S), with
ClusterConfig's defaults (cluster/config/pools.py), because Helm cannot run Python;
tests/unit/test_helm_upgrade.py renders it for each preset and variant against the Python and
names the drift. Plus tandem.oldClusterMarginS; upgrade.oldClusterDeletionDelaySeconds overrides.
*/}}
{{- define "tandem.oldClusterDeletionDelayS" -}}
{{- $override := (.Values.upgrade | default dict).oldClusterDeletionDelaySeconds -}}
{{- if not (kindIs "invalid" $override) -}}
{{- int $override -}}
{{- else -}}
{{- $cfg := include "tandem.clusterConfig" . | fromJson -}}
{{- $minDrain := 20.0 -}}{{- /* MIN_DRAIN_S */ -}}
{{- $prefillLease := 22.0 -}}{{- /* PREFILL_LEASE_S: a 30 s lease less its 8 s margin */ -}}
{{- $maxModelLen := float64 (($cfg.model | default dict).max_model_len | default 2048) -}}
{{- $drain := 0.0 -}}
{{- range $tier, $t := $cfg.tiers -}}
{{- $itl := float64 (($t.slo | default dict).itl_s | default 0.1) -}}
{{- range $role := list "prefill" "decode" -}}
{{- $pool := get $t $role | default dict -}}
{{- $poolDrain := $pool.drain_timeout_s -}}
{{- if kindIs "invalid" $poolDrain -}}
{{- $poolDrain = ternary (maxf $minDrain (mulf $maxModelLen $itl)) (addf $minDrain $prefillLease) (eq $role "decode") -}}
{{- end -}}
{{- $drain = maxf $drain $poolDrain -}}
{{- end -}}
{{- end -}}
{{- addf $drain (float64 (include "tandem.oldClusterMarginS" .)) | ceil | int -}}
{{- end -}}
{{- end -}}

{{/* Added to the gateway's drain before KubeRay deletes an old RayCluster: after KubeRay points
the Service at the new cluster, new connections still reach the old head until every node's
kube-proxy (or the Ingress controller) has the new endpoints, usually seconds; 30 s covers a slow
control plane. */}}
{{- define "tandem.oldClusterMarginS" -}}30{{- end -}}

{{/*
Environment of every Ray container: Ray's token auth (KubeRay's documented variables, set here
too so that Ray enforces it whatever the operator version), the KV transfer extras, the Hugging
Face cache and token (engines download a Hub model's weights, the gateway its tokenizer). No
secrets of tandem's own: those are in tandem.gatewayEnv, on the head only.
*/}}
{{- define "tandem.env" -}}
- name: RAY_AUTH_MODE
  value: token
- name: RAY_AUTH_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "tandem.rayAuthSecret" . }}
      key: auth_token
{{- range $name, $value := .Values.kvTransfer.env }}
- name: {{ $name }}
  value: {{ $value | quote }}
{{- end }}
- name: HF_HOME
  value: {{ include "tandem.hfCachePath" . }}
{{- with .Values.model.hfToken.secretName }}
- name: HF_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $.Values.model.hfToken.key }}
{{- end }}
- name: RAY_USAGE_STATS_ENABLED
  value: "0"
{{- /* vLLM's own logging set-up closes Serve's replica log files (cluster/vllm_logging.py) */}}
- name: VLLM_CONFIGURE_LOGGING
  value: "0"
{{- end -}}

{{/*
Environment only the head gets: API keys and the Redis password from their Secrets. The
gateway, the one deployment that reads them, is pinned to the head (tandem.gatewayResource);
engines on worker pods never see them.
*/}}
{{- define "tandem.gatewayEnv" -}}
{{- $auth := .Values.cluster.auth | default dict -}}
{{- range $key := $auth.keys | default list -}}
{{- if $key.env }}
- name: {{ $key.env }}
  valueFrom:
    secretKeyRef:
      name: {{ required "apiKeys.secretName is required when cluster.auth.keys read environment variables" $.Values.apiKeys.secretName }}
      key: {{ $key.env }}
{{- end -}}
{{- end -}}
{{- with (include "tandem.redisPasswordSecret" .) }}
- name: TANDEM_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $.Values.redis.passwordSecret.key }}
{{- end }}
{{- end -}}

{{/* The Secret holding Ray's auth token (key auth_token): the user's, or the chart's. */}}
{{- define "tandem.rayAuthSecret" -}}
{{- .Values.rayAuth.existingSecret | default (printf "%s-ray-auth" (include "tandem.fullname" .)) -}}
{{- end -}}

{{/* The Secret holding the Redis password: the user's; for the built-in Redis without one,
the chart's; "" for an external Redis without a password. */}}
{{- define "tandem.redisPasswordSecret" -}}
{{- if .Values.redis.passwordSecret.name -}}
{{- .Values.redis.passwordSecret.name -}}
{{- else if .Values.redis.builtin -}}
{{- printf "%s-redis" (include "tandem.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/*
A generated secret value, base64: the one already in the Secret `name` under `key` (helm
lookup, so upgrades keep it), else `length` random characters. Offline (helm template) lookup
finds nothing and every render makes a new one.
*/}}
{{- define "tandem.generatedSecret" -}}
{{- $existing := lookup "v1" "Secret" .root.Release.Namespace .name -}}
{{- if and $existing (hasKey ($existing.data | default dict) .key) -}}
{{- index $existing.data .key -}}
{{- else -}}
{{- randAlphaNum (int .length) | b64enc -}}
{{- end -}}
{{- end -}}

{{/* The Ray custom resource only the head advertises; the Gateway deployment asks for it. */}}
{{- define "tandem.gatewayResource" -}}tandem-gateway{{- end -}}

{{/* Peers that are Ray pods of this release (head or worker), for the NetworkPolicies. */}}
{{- define "tandem.rayPeers" -}}
- podSelector:
    matchLabels:
      {{- include "tandem.selectorLabels" . | nindent 6 }}
    matchExpressions:
      - key: {{ include "tandem.componentKey" . }}
        operator: In
        values: [ray-head, ray-worker]
{{- end -}}

{{/* Where every Ray pod's Hugging Face cache (HF_HOME) is mounted. */}}
{{- define "tandem.hfCachePath" -}}/cache/huggingface{{- end -}}

{{/* Volumes and mounts of every Ray pod: the model, the Hugging Face cache and /dev/shm. */}}
{{- define "tandem.volumes" -}}
- name: models
{{- if .Values.model.volume }}
{{ toYaml .Values.model.volume | indent 2 }}
{{- else }}
  emptyDir: {}
{{- end }}
- name: hf-cache
{{- if .Values.model.cache.volume }}
{{ toYaml .Values.model.cache.volume | indent 2 }}
{{- else }}
  emptyDir: {}
{{- end }}
- name: dshm
  emptyDir:
    medium: Memory
    sizeLimit: {{ .Values.kvTransfer.shmSize }}
{{- end -}}

{{- define "tandem.volumeMounts" -}}
- name: models
  mountPath: /models
  readOnly: {{ not .Values.model.prepare }}
- name: hf-cache
  mountPath: {{ include "tandem.hfCachePath" . }}
- name: dshm
  mountPath: /dev/shm
{{- end -}}

{{- define "tandem.initContainers" -}}
{{- if .Values.model.prepare }}
initContainers:
  - name: prepare-model
    image: {{ include "tandem.image" . }}
    imagePullPolicy: {{ .Values.image.pullPolicy }}
    command: ["tandem", "prepare-model", "--dest", {{ .Values.cluster.model.path | quote }}]
    volumeMounts:
      - name: models
        mountPath: /models
{{- end }}
{{- end -}}

{{/*
The image of every Ray pod: image.repository, tagged image.tag or else the chart's appVersion
(deploy/docker builds ghcr.io/tandem/tandem:<appVersion> for GPUs and tandem-cpu for CPUs).
*/}}
{{- define "tandem.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
