{{/*
Names.
*/}}
{{- define "kvpick.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kvpick.fullname" -}}
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

{{- define "kvpick.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The headless Service listing the replicas (DYN_EPP_PEER_SERVICE). */}}
{{- define "kvpick.peerService" -}}
{{- printf "%s-peers" (include "kvpick.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The tokenizer Service in front of the pool's pods. */}}
{{- define "kvpick.tokenizerService" -}}
{{- printf "%s-tokenizer" (include "kvpick.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kvpick.workersConfigMap" -}}
{{- if and (not .Values.discovery.static.workers) .Values.discovery.static.existingConfigMap }}
{{- .Values.discovery.static.existingConfigMap }}
{{- else }}
{{- printf "%s-workers" (include "kvpick.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "kvpick.poolName" -}}
{{- default .Release.Name .Values.inferencePool.name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kvpick.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kvpick.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Labels.
*/}}
{{- define "kvpick.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvpick.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: endpoint-picker
{{- end }}

{{- define "kvpick.labels" -}}
helm.sh/chart: {{ include "kvpick.chart" . }}
{{ include "kvpick.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: kvpick
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels for objects that are not kvpick's pods (pool, route, tokenizer Service). */}}
{{- define "kvpick.commonLabels" -}}
helm.sh/chart: {{ include "kvpick.chart" . }}
app.kubernetes.io/name: {{ include "kvpick.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: kvpick
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
Derived settings.
*/}}
{{- define "kvpick.kubernetesMode" -}}
{{- if eq .Values.discovery.mode "kubernetes" }}true{{ end }}
{{- end }}

{{/* Peers: more than one replica, Kubernetes discovery (the peer watch is part of it). */}}
{{- define "kvpick.peers" -}}
{{- if and (include "kvpick.kubernetesMode" .) (gt (int .Values.replicaCount) 1) }}true{{ end }}
{{- end }}

{{- define "kvpick.tokenizerProtocol" -}}
{{- if .Values.tokenizer.protocol }}
{{- .Values.tokenizer.protocol }}
{{- else if eq .Values.engine.kind "sglang" }}
{{- "sglang-tokenize" }}
{{- else }}
{{- "vllm-render" }}
{{- end }}
{{- end }}

{{/* TensorRT-LLM: no tokenizer endpoint to point a Service at. */}}
{{- define "kvpick.tensorrtLlm" -}}
{{- if hasPrefix "trtllm" .Values.engine.kind }}
{{- if not .Values.tokenizer.local.volume }}
{{- fail "engine.kind trtllm/trtllm-zmq needs tokenizer.local (TensorRT-LLM has no tokenizer endpoint)" }}
{{- end }}true
{{- end }}
{{- end }}

{{/* Whether the chart makes the tokenizer Service (and points kvpick at it). */}}
{{- define "kvpick.tokenizerServiceEnabled" -}}
{{- if and (include "kvpick.kubernetesMode" .) (not .Values.tokenizer.url) .Values.tokenizer.service.create (not (include "kvpick.tensorrtLlm" .)) }}true{{ end }}
{{- end }}

{{- define "kvpick.tokenizerUrl" -}}
{{- if .Values.tokenizer.url }}
{{- .Values.tokenizer.url }}
{{- else if include "kvpick.tokenizerServiceEnabled" . }}
{{- printf "http://%s.%s.svc:%d" (include "kvpick.tokenizerService" .) .Release.Namespace (int (first .Values.inferencePool.targetPorts)) }}
{{- end }}
{{- end }}

{{- define "kvpick.secureServing" -}}
{{- if kindIs "bool" .Values.gateway.secureServing }}
{{- .Values.gateway.secureServing }}
{{- else }}
{{- ne .Values.gateway.flavour "istio" }}
{{- end }}
{{- end }}

{{/*
A value as an environment variable string: whole numbers without an
exponent (values files give numbers as float64: 16777216 would print as
1.6777216e+07), everything else as Go prints it.
*/}}
{{- define "kvpick.envString" -}}
{{- if kindIs "float64" . }}
{{- if eq . (float64 (int64 .)) }}{{ int64 . }}{{ else }}{{ . }}{{ end }}
{{- else }}
{{- . }}
{{- end }}
{{- end }}

{{/*
An env entry of the kvpick container (indented for its env list), only when
the value is set (not null, not ""). Called as
{{- include "kvpick.optEnv" (list "NAME" value) }}
*/}}
{{- define "kvpick.optEnv" -}}
{{- $v := index . 1 }}
{{- if not (or (kindIs "invalid" $v) (and (kindIs "string" $v) (eq $v ""))) }}
{{- printf "- name: %s\n  value: %s" (index . 0) (include "kvpick.envString" $v | quote) | nindent 12 }}
{{- end }}
{{- end }}

{{/*
Checks that fail the render with a message naming the value.
*/}}
{{- define "kvpick.validate" -}}
{{- if and (eq .Values.gateway.flavour "agentgateway") .Values.gateway.fallbacksInHeader }}
{{- fail "gateway.fallbacksInHeader must be false with gateway.flavour=agentgateway: agentgateway answers 503 to a list of endpoints in the header" }}
{{- end }}
{{- if and (include "kvpick.kubernetesMode" .) (not (include "kvpick.tokenizerUrl" .)) (not .Values.tokenizer.local.volume) }}
{{- fail "Kubernetes discovery needs a tokenizer: set tokenizer.url or tokenizer.local, or keep tokenizer.service.create=true" }}
{{- end }}
{{- if and (include "kvpick.tokenizerServiceEnabled" .) (not .Values.inferencePool.selector) }}
{{- fail "tokenizer.service.create needs inferencePool.selector (the model server pods' labels)" }}
{{- end }}
{{- if and .Values.inferencePool.create (not .Values.inferencePool.selector) }}
{{- fail "inferencePool.create needs inferencePool.selector (the model server pods' labels)" }}
{{- end }}
{{- if and (eq .Values.discovery.mode "static") (not .Values.discovery.static.workers) (not .Values.discovery.static.existingConfigMap) }}
{{- fail "discovery.mode=static needs discovery.static.workers or discovery.static.existingConfigMap" }}
{{- end }}
{{- if and (not (kindIs "invalid" .Values.queue.threshold)) (kindIs "invalid" .Values.engine.maxNumBatchedTokens) }}
{{- fail "queue.threshold needs engine.maxNumBatchedTokens (DYN_EPP_MAX_NUM_BATCHED_TOKENS)" }}
{{- end }}
{{- end }}
