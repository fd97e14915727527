{{/* Chart name, truncated to the 63 characters of a DNS label. */}}
{{- define "sluice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name. */}}
{{- define "sluice.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "sluice.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Envoy's failure_mode_deny: sidecar.envoy.failureModeDeny when set, else true
exactly when failureMode is closed, so that Sluice being unreachable does not open a
domain that fails closed. */}}
{{- define "sluice.failureModeDeny" -}}
{{- $deny := .Values.sidecar.envoy.failureModeDeny }}
{{- if kindIs "bool" $deny }}{{ $deny }}{{ else }}{{ eq .Values.failureMode "closed" }}{{ end }}
{{- end }}

{{/* Labels of every object, without a component. */}}
{{- define "sluice.commonLabels" -}}
helm.sh/chart: {{ include "sluice.chart" . }}
{{ include "sluice.baseSelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels of Sluice's own objects. */}}
{{- define "sluice.labels" -}}
{{ include "sluice.commonLabels" . }}
app.kubernetes.io/component: ratelimit
{{- end }}

{{- define "sluice.baseSelectorLabels" -}}
app.kubernetes.io/name: {{ include "sluice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Selects Sluice pods only (not the bundled Redis). */}}
{{- define "sluice.selectorLabels" -}}
{{ include "sluice.baseSelectorLabels" . }}
app.kubernetes.io/component: ratelimit
{{- end }}

{{- define "sluice.serviceAccountName" -}}
{{- include "sluice.serviceAccountNameFor" (dict "root" . "values" .Values) }}
{{- end }}

{{/* The ServiceAccount the RBAC binds, from (dict "root" . "values" V): a parent chart
running "sluice.container" with kube.enabled gives it to its pod. */}}
{{- define "sluice.serviceAccountNameFor" -}}
{{- $sa := .values.serviceAccount }}
{{- if $sa.create }}
{{- default (include "sluice.fullnameFor" .) $sa.name }}
{{- else }}
{{- default "default" $sa.name }}
{{- end }}
{{- end }}

{{/*
Fully qualified name computed from (dict "root" CONTEXT "values" SLUICE_VALUES), so
that a parent chart including the helpers names things as this chart does.
*/}}
{{- define "sluice.fullnameFor" -}}
{{- if .values.fullnameOverride }}
{{- .values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default "sluice" .values.nameOverride }}
{{- if contains $name .root.Release.Name }}
{{- .root.Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .root.Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Names of Services beside the main one: the fullname cut so that the suffixed
name stays a DNS label of at most 63 characters. */}}
{{- define "sluice.headlessName" -}}
{{- include "sluice.fullname" . | trunc 54 | trimSuffix "-" }}-headless
{{- end }}

{{/* The bundled Redis's Service and Deployment, from (dict "root" . "values" V). */}}
{{- define "sluice.redisNameFor" -}}
{{- include "sluice.fullnameFor" . | trunc 57 | trimSuffix "-" }}-redis
{{- end }}

{{/* Bytes of a Kubernetes memory quantity (dict "q" QUANTITY "name" VALUE_NAME, and
"hint" added to the message):
whole numbers with no suffix or one of k M G T Ki Mi Gi Ti; fails naming the value
otherwise. */}}
{{- define "sluice.bytes" -}}
{{- $q := .q -}}
{{- if or (kindIs "float64" $q) (kindIs "int" $q) (kindIs "int64" $q) }}{{ $q = printf "%d" (int64 $q) }}{{ end -}}
{{- $q = toString $q -}}
{{- if not (regexMatch "^[0-9]+(k|M|G|T|Ki|Mi|Gi|Ti)?$" $q) -}}
{{- fail (printf "sluice: %s is %q: give whole bytes, with no suffix or one of k, M, G, T, Ki, Mi, Gi, Ti (e.g. 192Mi)%s" .name $q (.hint | default "")) -}}
{{- end -}}
{{- $n := regexFind "^[0-9]+" $q -}}
{{- $unit := trimPrefix $n $q -}}
{{- $mult := get (dict "" 1 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776) $unit -}}
{{- mul (int64 $n) $mult -}}
{{- end }}

{{/* The bundled Redis's maxmemory in bytes (same arguments as "sluice.redisNameFor"):
redis.bundled.maxmemory, else 3/4 of the container's memory limit and at least 16Mi
below it (the rest is Redis's own: some 10Mi before any key, allocator
fragmentation, client buffers); empty with neither. */}}
{{- define "sluice.redisMaxmemory" -}}
{{- $r := .values.redis.bundled -}}
{{- $limit := dig "limits" "memory" "" ($r.resources | default dict) -}}
{{- $limitBytes := 0 -}}
{{- if $limit -}}
{{- /* A limit in another form (0.5Gi, 1e9) is no error when maxmemory is given. */}}
{{- if and $r.maxmemory (not (regexMatch "^[0-9]+(k|M|G|T|Ki|Mi|Gi|Ti)?$" (toString $limit))) -}}
{{- $limit = "" -}}
{{- else -}}
{{- $limitBytes = include "sluice.bytes" (dict "q" $limit "name" "redis.bundled.resources.limits.memory" "hint" ", or set redis.bundled.maxmemory") | int64 -}}
{{- end -}}
{{- end -}}
{{- if $r.maxmemory -}}
{{- $max := include "sluice.bytes" (dict "q" $r.maxmemory "name" "redis.bundled.maxmemory") | int64 -}}
{{- if eq $max 0 }}{{ fail "sluice: redis.bundled.maxmemory must be above 0 (Redis reads 0 as no limit)" }}{{ end -}}
{{- if and $limit (ge $max $limitBytes) -}}
{{- fail (printf "sluice: redis.bundled.maxmemory (%v) must be below the container's memory limit (%v), with room for Redis's own overhead: at the limit the kubelet kills Redis instead of Redis evicting counters" $r.maxmemory $limit) -}}
{{- end -}}
{{- $max -}}
{{- else if $limit -}}
{{- if lt $limitBytes 33554432 -}}
{{- fail (printf "sluice: redis.bundled.resources.limits.memory (%v) leaves Redis no room for counters: give at least 32Mi, or set redis.bundled.maxmemory" $limit) -}}
{{- end -}}
{{- min (div (mul $limitBytes 3) 4) (sub $limitBytes 16777216) -}}
{{- end -}}
{{- end }}

{{/* The Redis URLs sluice is given, from (dict "root" . "values" V): explicit ones, or the bundled Redis. */}}
{{- define "sluice.redisUrls" -}}
{{- if .values.redis.bundled.enabled -}}
redis://{{ include "sluice.redisNameFor" . }}:6379
{{- else -}}
{{- join "," .values.redis.urls -}}
{{- end -}}
{{- end }}

{{/* "true" when sluice counts its replicas from its own Service's EndpointSlices,
from (dict "root" . "values" V): localShare.fromService with a Redis store (the
share matters only then), outside mode: helpers (no Service of the chart's own). */}}
{{- define "sluice.countsFromService" -}}
{{- $v := .values -}}
{{- if ne $v.mode "helpers" -}}
{{- $r := $v.redis -}}
{{- if and $v.localShare.fromService (or $r.urls $r.clusterUrls $r.existingSecret $r.bundled.enabled $r.sentinel.urls) -}}
true
{{- end -}}
{{- end -}}
{{- end }}

{{/* "true" when each replica advertises its pod IP and HTTP port to the others
(--local-share-advertise), from (dict "root" . "values" V): with a Redis store (the
heartbeat carries it), and a plain HTTP port (the peers' questions are plain HTTP). */}}
{{- define "sluice.advertises" -}}
{{- $v := .values -}}
{{- $r := $v.redis -}}
{{- if and (or $r.urls $r.clusterUrls $r.existingSecret $r.bundled.enabled $r.sentinel.urls) (not $v.tls.http.enabled) -}}
true
{{- end -}}
{{- end }}

{{/* Checks that settings fit together; fails the render with a message otherwise. */}}
{{- define "sluice.validate" -}}
{{- $redisSources := 0 }}
{{- if .Values.redis.urls }}{{ $redisSources = add1 $redisSources }}{{ end }}
{{- if .Values.redis.clusterUrls }}{{ $redisSources = add1 $redisSources }}{{ end }}
{{- if .Values.redis.existingSecret }}{{ $redisSources = add1 $redisSources }}{{ end }}
{{- if .Values.redis.bundled.enabled }}{{ $redisSources = add1 $redisSources }}{{ end }}
{{- $sentinel := .Values.redis.sentinel }}
{{- if $sentinel.urls }}{{ $redisSources = add1 $redisSources }}{{ end }}
{{- if gt $redisSources 1 }}
{{- fail "sluice: set only one of redis.urls, redis.clusterUrls, redis.existingSecret, redis.bundled.enabled and redis.sentinel.urls" }}
{{- end }}
{{- $secretFor := .Values.redis.existingSecretFor | default "urls" }}
{{- if and (ne $secretFor "urls") (not .Values.redis.existingSecret) }}
{{- fail (printf "sluice: redis.existingSecretFor: %s needs redis.existingSecret (the Secret holding the list)" $secretFor) }}
{{- end }}
{{- $sentinels := or $sentinel.urls (and .Values.redis.existingSecret (eq $secretFor "sentinel.urls")) }}
{{- if and $sentinels (eq (empty $sentinel.masters) (empty $sentinel.existingSecret)) }}
{{- fail "sluice: the sentinels (redis.sentinel.urls, or redis.existingSecret with existingSecretFor: sentinel.urls) need their masters: set one of redis.sentinel.masters and redis.sentinel.existingSecret" }}
{{- end }}
{{- if and (not $sentinels) (or $sentinel.masters $sentinel.existingSecret) }}
{{- fail "sluice: redis.sentinel.masters and redis.sentinel.existingSecret need the sentinels to ask: redis.sentinel.urls, or redis.existingSecret with existingSecretFor: sentinel.urls" }}
{{- end }}
{{- if and (not .Values.kube.enabled) (not .Values.policies) (not .Values.existingPolicyConfigMaps) (not .Values.xds.server) }}
{{- fail "sluice: give it policies: kube.enabled=true (RateLimitPolicy resources), inline `policies`, existingPolicyConfigMaps, or xds.server" }}
{{- end }}
{{- if and (hasPrefix "https://" .Values.xds.server) (not .Values.xds.tls.existingSecret) }}
{{- fail "sluice: an https:// xds.server needs xds.tls.existingSecret (ca.crt, tls.crt, tls.key): Sluice trusts only the authority given for it" }}
{{- end }}
{{- if and (or .Values.xds.tls.existingSecret .Values.xds.tls.serverName) (not (hasPrefix "https://" .Values.xds.server)) }}
{{- fail "sluice: xds.tls.* needs an https:// xds.server" }}
{{- end }}
{{- /* Every port sluice (and, as a sidecar, Envoy) listens on in the pod: two on one
number would leave the second unable to bind, and the pod crash-looping. */}}
{{- $ports := list (list "ports.grpc" .Values.ports.grpc) (list "ports.http" .Values.ports.http) }}
{{- if .Values.admin.enabled }}
{{- $ports = append $ports (list "ports.admin" (.Values.ports.admin | default 8082)) }}
{{- end }}
{{- if .Values.metrics.compat.enabled }}
{{- $ports = append $ports (list "metrics.compat.port" .Values.metrics.compat.port) }}
{{- end }}
{{- if eq .Values.mode "sidecar" }}
{{- $ports = append $ports (list "sidecar.envoy.listenerPort" .Values.sidecar.envoy.listenerPort) }}
{{- $ports = append $ports (list "sidecar.envoy.adminPort" .Values.sidecar.envoy.adminPort) }}
{{- end }}
{{- $seen := dict }}
{{- range $ports }}
{{- $name := index . 0 }}
{{- $port := toString (int (index . 1)) }}
{{- with get $seen $port }}
{{- fail (printf "sluice: %s and %s are both port %s; each port in the pod needs a number of its own" . $name $port) }}
{{- end }}
{{- $_ := set $seen $port $name }}
{{- end }}
{{- /* The grace period runs from the preStop hook: its sleep, then sluice's
--drain-delay (2 s) and --shutdown-grace. */}}
{{- $stop := add (int .Values.preStopSleepSeconds) 2 (int .Values.shutdownGraceSeconds) }}
{{- if ge $stop (int .Values.terminationGracePeriodSeconds) }}
{{- fail (printf "sluice: preStopSleepSeconds (%d) + 2 s of --drain-delay + shutdownGraceSeconds (%d) must be below terminationGracePeriodSeconds (%d): the kubelet's grace period starts with the preStop hook, and it kills sluice before in-flight calls finish otherwise" (int .Values.preStopSleepSeconds) (int .Values.shutdownGraceSeconds) (int .Values.terminationGracePeriodSeconds)) }}
{{- end }}
{{- range $port := list "grpc" "http" }}
{{- $t := index $.Values.tls $port }}
{{- if $t.enabled }}
{{- if eq (empty $t.existingSecret) (not $t.certManager.enabled) }}
{{- fail (printf "sluice: tls.%s.enabled needs exactly one of tls.%s.existingSecret and tls.%s.certManager.enabled" $port $port $port) }}
{{- end }}
{{- if and $t.certManager.enabled (not $t.certManager.issuerRef.name) }}
{{- fail (printf "sluice: tls.%s.certManager.issuerRef.name names the cert-manager issuer that signs the certificate" $port) }}
{{- end }}
{{- end }}
{{- end }}
{{- with .Values.autoscaling }}
{{- if .enabled }}
{{- if eq $.Values.mode "helpers" }}
{{- fail "sluice: autoscaling is for the chart's own Deployment, which mode: helpers does not render: scale your chart's pods instead" }}
{{- end }}
{{- if gt (int .minReplicas) (int .maxReplicas) }}
{{- fail (printf "sluice: autoscaling.minReplicas (%d) must not be above autoscaling.maxReplicas (%d)" (int .minReplicas) (int .maxReplicas)) }}
{{- end }}
{{- if not (or .targetCPUUtilizationPercentage .targetMemoryUtilizationPercentage) }}
{{- fail "sluice: autoscaling needs a target: autoscaling.targetCPUUtilizationPercentage or targetMemoryUtilizationPercentage" }}
{{- end }}
{{- /* The autoscaler reads a resource's utilization against every container's
request of it, and scales on nothing when one has none. */}}
{{- $containers := list (list "resources" $.Values.resources) }}
{{- if eq $.Values.mode "sidecar" }}
{{- $containers = append $containers (list "sidecar.envoy.resources" $.Values.sidecar.envoy.resources) }}
{{- end }}
{{- range $resource, $target := dict "cpu" .targetCPUUtilizationPercentage "memory" .targetMemoryUtilizationPercentage }}
{{- if $target }}
{{- range $containers }}
{{- if not (dig "requests" $resource "" (index . 1 | default dict)) }}
{{- fail (printf "sluice: autoscaling on %s utilization needs %s.requests.%s (utilization is measured against it)" $resource (index . 0) $resource) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- if and .Values.serviceMonitor.clientCertSecret (not (and .Values.tls.http.enabled .Values.tls.http.clientCA)) }}
{{- fail "sluice: serviceMonitor.clientCertSecret is the certificate Prometheus presents to a port that asks for one: it needs tls.http.enabled and tls.http.clientCA" }}
{{- end }}
{{- if and .Values.tls.grpc.enabled (ne .Values.mode "deployment") }}
{{- fail "sluice: tls.grpc is for mode: deployment; in the other modes Envoy calls Sluice over loopback in plain text" }}
{{- end }}
{{- if and .Values.tls.http.enabled .Values.tls.http.clientCA (or (include "sluice.probeHttpGet" .Values.livenessProbe) (include "sluice.probeHttpGet" .Values.readinessProbe)) }}
{{- fail "sluice: with tls.http.clientCA the kubelet's httpGet probes cannot pass (it presents no client certificate): give livenessProbe and readinessProbe without httpGet (for example grpc: {port: 8081})" }}
{{- end }}
{{- end }}

{{/* The Secret of a port's TLS files, from (dict "root" . "values" V "port" "grpc"|"http"). */}}
{{- define "sluice.tlsSecret" -}}
{{- $t := index .values.tls .port -}}
{{- if $t.existingSecret -}}
{{- $t.existingSecret -}}
{{- else -}}
{{- include "sluice.fullnameFor" . }}-{{ .port }}-tls
{{- end -}}
{{- end }}

{{/* "true" when a probe of the values gets the HTTP port: Helm merges a probe given
with grpc, tcpSocket or exec into the default httpGet, and such a handler replaces it. */}}
{{- define "sluice.probeHttpGet" -}}
{{- if and .httpGet (not (or .grpc .tcpSocket .exec)) -}}
true
{{- end -}}
{{- end }}

{{/* A probe of the values, with one handler (see "sluice.probeHttpGet"), over HTTPS
when the HTTP port serves TLS (same arguments and "probe"). */}}
{{- define "sluice.probe" -}}
{{- $p := deepCopy .probe -}}
{{- if not (include "sluice.probeHttpGet" $p) -}}
{{- $_ := unset $p "httpGet" -}}
{{- end -}}
{{- if and .values.tls.http.enabled $p.httpGet -}}
{{- $_ := set $p.httpGet "scheme" "HTTPS" -}}
{{- end -}}
{{- toYaml $p -}}
{{- end }}

{{/*
The `sluice serve` arguments for the values in `.values` and the release in `.root`.
In sidecar mode the gRPC port listens on loopback only: Envoy is in the same pod.
`[::]` is every address of both families, so IPv6-only and dual-stack clusters
reach the pod too.
*/}}
{{- define "sluice.args" -}}
{{- $v := .values -}}
- serve
- --grpc-addr={{ if eq $v.mode "deployment" }}[::]{{ else }}127.0.0.1{{ end }}:{{ $v.ports.grpc }}
- --http-addr=[::]:{{ $v.ports.http }}
{{- if and $v.admin $v.admin.enabled }}
{{- /* An IPv6 address goes in brackets before its port. */}}
{{- $addr := $v.admin.address }}
{{- if and (contains ":" $addr) (not (hasPrefix "[" $addr)) }}
{{- $addr = printf "[%s]" $addr }}
{{- end }}
- --admin-addr={{ $addr }}:{{ $v.ports.admin | default 8082 }}
{{- else }}
- --admin-addr=off
{{- end }}
{{- if $v.policies }}
- --config=/etc/sluice/policies
{{- end }}
{{- range $v.existingPolicyConfigMaps }}
- --config=/etc/sluice/extra/{{ . }}
{{- end }}
{{- if $v.kube.enabled }}
- --kube
{{- with $v.kube.namespace }}
- --kube-namespace={{ . }}
{{- end }}
{{- with $v.kube.sharedDomains }}
- --shared-domains={{ join "," . }}
{{- end }}
{{- end }}
{{- with $v.xds }}
{{- if .server }}
- --xds-server={{ .server }}
- --xds-node-id={{ .nodeId }}
{{- if .tls.existingSecret }}
- --xds-tls-ca=/etc/sluice/tls/xds/ca.crt
- --xds-tls-cert=/etc/sluice/tls/xds/tls.crt
- --xds-tls-key=/etc/sluice/tls/xds/tls.key
{{- end }}
{{- with .tls.serverName }}
- --xds-tls-server-name={{ . }}
{{- end }}
{{- end }}
{{- end }}
{{- if or $v.redis.urls $v.redis.bundled.enabled }}
- --redis={{ include "sluice.redisUrls" . }}
{{- end }}
{{- with $v.redis.clusterUrls }}
- --redis-cluster={{ join "," . }}
{{- end }}
{{- with $v.redis.sentinel.urls }}
- --redis-sentinel={{ join "," . }}
{{- end }}
{{- with $v.redis.sentinel.masters }}
- --redis-sentinel-master={{ join "," . }}
{{- end }}
- --failure-mode={{ $v.failureMode }}
{{- if include "sluice.countsFromService" . }}
- --local-share-service={{ .root.Release.Namespace }}/{{ include "sluice.fullnameFor" . }}
{{- end }}
{{- if include "sluice.advertises" . }}
- --local-share-advertise=$(SLUICE_POD_IP):{{ $v.ports.http }}
{{- end }}
- --store-timeout={{ $v.storeTimeout }}
- --response-headers={{ $v.responseHeaders }}
- --default-algorithm={{ $v.defaultAlgorithm }}
- --log-format={{ $v.logFormat }}
- --max-keys={{ int64 $v.maxKeys }}
- --reload-interval={{ $v.reloadInterval }}
{{- with $v.rlqs }}
{{- with .assignmentTtl }}
- --rlqs-assignment-ttl={{ . }}
{{- end }}
{{- with .abandonAfter }}
- --rlqs-abandon-after={{ . }}
{{- end }}
{{- end }}
- --shutdown-grace={{ $v.shutdownGraceSeconds }}s
{{- range $port := list "grpc" "http" }}
{{- $t := index $v.tls $port }}
{{- if $t.enabled }}
- --{{ $port }}-tls-cert=/etc/sluice/tls/{{ $port }}/tls.crt
- --{{ $port }}-tls-key=/etc/sluice/tls/{{ $port }}/tls.key
{{- if $t.clientCA }}
- --{{ $port }}-tls-client-ca=/etc/sluice/tls/{{ $port }}/ca.crt
{{- end }}
{{- end }}
{{- end }}
{{- if $v.metrics.compat.enabled }}
- --prometheus-addr=[::]:{{ $v.metrics.compat.port }}
{{- end }}
{{- if $v.hashKeys }}
{{- if not $v.hashSecret.existingSecret }}
{{- fail "hashKeys needs hashSecret.existingSecret: a Secret holding the hash key, the same for every replica" }}
{{- end }}
- --hash-keys
{{- end }}
{{- range $v.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}

{{/*
The sluice container. Other charts can run Sluice as a sidecar by depending on this
chart and including it in their own pod spec:

  serviceAccountName: {{ include "sluice.serviceAccountNameFor" (dict "root" . "values" .Values.sluice) }}
  automountServiceAccountToken: true   # for kube.enabled: the RBAC binds this account
  containers:
    - name: envoy
      ...
    {{- include "sluice.container" (dict "root" . "values" .Values.sluice) | nindent 4 }}
  volumes:
    {{- include "sluice.volumes" (dict "root" . "values" .Values.sluice) | nindent 4 }}

`values` is this chart's values (a parent chart's `.Values.sluice` carries them
merged with these defaults); `root` is the including chart's top-level context.
Set the dependency's `mode: helpers` so that this chart renders no Deployment of its
own (only the policies ConfigMap, ServiceAccount and RBAC); in every mode but
`deployment` Sluice listens for gRPC on 127.0.0.1 only, for Envoy in the same pod.
*/}}
{{- define "sluice.container" -}}
{{- $v := .values -}}
- name: sluice
  image: "{{ $v.image.repository }}:{{ $v.image.tag | default .root.Chart.AppVersion }}"
  imagePullPolicy: {{ $v.image.pullPolicy }}
  args:
    {{- include "sluice.args" . | nindent 4 }}
  env:
    - name: RUST_LOG
      value: info
    {{- if include "sluice.advertises" . }}
    - name: SLUICE_POD_IP
      valueFrom:
        fieldRef:
          fieldPath: status.podIP
    {{- end }}
    {{- if $v.redis.existingSecret }}
    {{- /* The list the Secret holds, for the flag that takes it. */}}
    - name: {{ get (dict "urls" "SLUICE_REDIS" "clusterUrls" "SLUICE_REDIS_CLUSTER" "sentinel.urls" "SLUICE_REDIS_SENTINEL") ($v.redis.existingSecretFor | default "urls") }}
      valueFrom:
        secretKeyRef:
          name: {{ $v.redis.existingSecret }}
          key: {{ $v.redis.existingSecretKey }}
    {{- end }}
    {{- if $v.redis.sentinel.existingSecret }}
    - name: SLUICE_REDIS_SENTINEL_MASTER
      valueFrom:
        secretKeyRef:
          name: {{ $v.redis.sentinel.existingSecret }}
          key: {{ $v.redis.sentinel.existingSecretKey }}
    {{- end }}
    {{- if $v.hashSecret.existingSecret }}
    - name: SLUICE_HASH_SECRET
      valueFrom:
        secretKeyRef:
          name: {{ $v.hashSecret.existingSecret }}
          key: {{ $v.hashSecret.key }}
    {{- end }}
    {{- with $v.tracing }}
    {{- if .enabled }}
    - name: SLUICE_TRACING
      value: "true"
    {{- with .endpoint }}
    - name: SLUICE_OTLP_ENDPOINT
      value: {{ . | quote }}
    {{- end }}
    {{- with .protocol }}
    - name: SLUICE_OTLP_PROTOCOL
      value: {{ . | quote }}
    {{- end }}
    {{- with .samplerRatio }}
    - name: SLUICE_TRACING_SAMPLER_RATIO
      value: {{ . | quote }}
    {{- end }}
    - name: SLUICE_POD_NAME
      valueFrom:
        fieldRef:
          fieldPath: metadata.name
    - name: SLUICE_POD_NAMESPACE
      valueFrom:
        fieldRef:
          fieldPath: metadata.namespace
    - name: SLUICE_TRACING_RESOURCE_ATTRIBUTES
      value: "k8s.pod.name=$(SLUICE_POD_NAME),k8s.namespace.name=$(SLUICE_POD_NAMESPACE)"
    {{- end }}
    {{- end }}
    {{- with $v.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  ports:
    - name: grpc
      containerPort: {{ $v.ports.grpc }}
      protocol: TCP
    - name: http
      containerPort: {{ $v.ports.http }}
      protocol: TCP
    {{- if $v.metrics.compat.enabled }}
    - name: metrics-compat
      containerPort: {{ $v.metrics.compat.port }}
      protocol: TCP
    {{- end }}
  livenessProbe:
    {{- include "sluice.probe" (merge (dict "probe" $v.livenessProbe) .) | nindent 4 }}
  readinessProbe:
    {{- include "sluice.probe" (merge (dict "probe" $v.readinessProbe) .) | nindent 4 }}
  {{- if gt (int $v.preStopSleepSeconds) 0 }}
  {{- if semverCompare "<1.30-0" .root.Capabilities.KubeVersion.Version }}
  {{- fail (printf "sluice: preStopSleepSeconds needs Kubernetes 1.30 or later (the preStop sleep action); this cluster is %s: set it to 0" .root.Capabilities.KubeVersion.Version) }}
  {{- end }}
  lifecycle:
    preStop:
      sleep:
        seconds: {{ $v.preStopSleepSeconds }}
  {{- end }}
  resources:
    {{- toYaml $v.resources | nindent 4 }}
  securityContext:
    {{- toYaml $v.securityContext | nindent 4 }}
  {{- if or $v.policies $v.existingPolicyConfigMaps $v.tls.grpc.enabled $v.tls.http.enabled $v.xds.tls.existingSecret $v.extraVolumeMounts }}
  volumeMounts:
    {{- if $v.policies }}
    - name: sluice-policies
      mountPath: /etc/sluice/policies
      readOnly: true
    {{- end }}
    {{- /* Volumes by index: a ConfigMap's name may be longer than a volume's. */}}
    {{- range $i, $name := $v.existingPolicyConfigMaps }}
    - name: sluice-extra-{{ $i }}
      mountPath: /etc/sluice/extra/{{ $name }}
      readOnly: true
    {{- end }}
    {{- range $port := list "grpc" "http" }}
    {{- if (index $v.tls $port).enabled }}
    - name: sluice-tls-{{ $port }}
      mountPath: /etc/sluice/tls/{{ $port }}
      readOnly: true
    {{- end }}
    {{- end }}
    {{- if $v.xds.tls.existingSecret }}
    - name: sluice-tls-xds
      mountPath: /etc/sluice/tls/xds
      readOnly: true
    {{- end }}
    {{- with $v.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- end }}
{{- end }}

{{/* The volumes "sluice.container" mounts, and extraVolumes (same arguments). */}}
{{- define "sluice.volumes" -}}
{{- $v := .values -}}
{{- if $v.policies }}
- name: sluice-policies
  configMap:
    name: {{ include "sluice.policiesConfigMapName" . }}
{{- end }}
{{- range $i, $name := $v.existingPolicyConfigMaps }}
- name: sluice-extra-{{ $i }}
  configMap:
    name: {{ $name }}
{{- end }}
{{- range $port := list "grpc" "http" }}
{{- if (index $v.tls $port).enabled }}
- name: sluice-tls-{{ $port }}
  secret:
    secretName: {{ include "sluice.tlsSecret" (merge (dict "port" $port) $) }}
{{- end }}
{{- end }}
{{- with $v.xds.tls.existingSecret }}
- name: sluice-tls-xds
  secret:
    secretName: {{ . }}
{{- end }}
{{- with $v.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Name of the inline policies' ConfigMap (same arguments). */}}
{{- define "sluice.policiesConfigMapName" -}}
{{ include "sluice.fullnameFor" . }}-policies
{{- end }}
