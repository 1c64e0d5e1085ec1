{{/* Names */}}
{{- define "warren.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "warren.fullname" -}}
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

{{/* "<fullname>-<component>", for a dict {root, component}. */}}
{{- define "warren.componentName" -}}
{{- printf "%s-%s" (include "warren.fullname" .root) .component | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels, for a dict {root, component}. */}}
{{- define "warren.selectorLabels" -}}
app.kubernetes.io/name: {{ include "warren.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "warren.labels" -}}
{{ include "warren.selectorLabels" . }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: warren
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "warren.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Secrets */}}
{{- define "warren.secretsName" -}}
{{- default (printf "%s-secrets" (include "warren.fullname" .)) .Values.secrets.existingSecret }}
{{- end }}

{{/*
A secret value that stays the same across upgrades: the given value, else the one already stored in the cluster,
else a new random one. Dict {root, secret, key, given, length}.
*/}}
{{- define "warren.stableSecret" -}}
{{- $existing := lookup "v1" "Secret" .root.Release.Namespace .secret | default dict }}
{{- $stored := dig "data" .key "" $existing }}
{{- if .given }}
{{- .given }}
{{- else if $stored }}
{{- $stored | b64dec }}
{{- else }}
{{- randAlphaNum (int .length) }}
{{- end }}
{{- end }}

{{/* WARREN_SECRETS_KEYS: given, else kept from the cluster, else one generated key `k1:<base64 of 32 bytes>`. */}}
{{- define "warren.secretsKeys" -}}
{{- $existing := lookup "v1" "Secret" .root.Release.Namespace .secret | default dict }}
{{- $stored := dig "data" "secretsKeys" "" $existing }}
{{- if .root.Values.secrets.secretsKeys }}
{{- .root.Values.secrets.secretsKeys }}
{{- else if $stored }}
{{- $stored | b64dec }}
{{- else }}
{{- printf "k1:%s" (randAlphaNum 32 | b64enc) }}
{{- end }}
{{- end }}

{{- define "warren.postgresql.secretName" -}}
{{- default (include "warren.componentName" (dict "root" . "component" "postgresql")) .Values.postgresql.auth.existingSecret }}
{{- end }}

{{- define "warren.postgresql.secretKey" -}}
{{- ternary .Values.postgresql.auth.existingSecretKey "password" (ne .Values.postgresql.auth.existingSecret "") }}
{{- end }}

{{- define "warren.redis.secretName" -}}
{{- default (include "warren.componentName" (dict "root" . "component" "redis")) .Values.redis.auth.existingSecret }}
{{- end }}

{{- define "warren.redis.secretKey" -}}
{{- ternary .Values.redis.auth.existingSecretKey "password" (ne .Values.redis.auth.existingSecret "") }}
{{- end }}

{{/*
Env entries giving WARREN_DATABASE_URL. In-cluster: the URL names no password and PGPASSWORD (read by the pg driver
when the URL has none) comes from the password Secret. External: the URL comes from a Secret.
*/}}
{{- define "warren.databaseEnv" -}}
{{- if .Values.postgresql.enabled }}
- name: PGPASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "warren.postgresql.secretName" . }}
      key: {{ include "warren.postgresql.secretKey" . }}
- name: WARREN_DATABASE_URL
  value: {{ printf "postgres://%s@%s:5432/%s" .Values.postgresql.auth.username (include "warren.componentName" (dict "root" . "component" "postgresql")) .Values.postgresql.auth.database | quote }}
{{- else }}
- name: WARREN_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ default (include "warren.componentName" (dict "root" . "component" "external-db")) .Values.externalDatabase.existingSecret }}
      key: {{ ternary .Values.externalDatabase.existingSecretKey "url" (ne .Values.externalDatabase.existingSecret "") }}
{{- end }}
{{- end }}

{{/*
Env entries giving a Redis URL under the variable name `.name` (every component reads WARREN_REDIS_URL).
In-cluster: REDIS_PASSWORD from the Secret, interpolated by Kubernetes into the URL. External: from a Secret.
Dict {root, name}.
*/}}
{{- define "warren.redisEnv" -}}
{{- $root := .root }}
{{- if $root.Values.redis.enabled }}
- name: REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "warren.redis.secretName" $root }}
      key: {{ include "warren.redis.secretKey" $root }}
- name: {{ .name }}
  value: {{ printf "redis://:$(REDIS_PASSWORD)@%s:6379" (include "warren.componentName" (dict "root" $root "component" "redis")) | quote }}
{{- else }}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ default (include "warren.componentName" (dict "root" $root "component" "external-redis")) $root.Values.externalRedis.existingSecret }}
      key: {{ ternary $root.Values.externalRedis.existingSecretKey "url" (ne $root.Values.externalRedis.existingSecret "") }}
{{- end }}
{{- end }}

{{- define "warren.masterUrl" -}}
{{- default (printf "http://%s:%d" (include "warren.componentName" (dict "root" . "component" "master")) (int .Values.master.service.port)) .Values.api.masterUrl }}
{{- end }}

{{/* Pod and container hardening for the unprivileged processes (api, master, proxy). */}}
{{- define "warren.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "warren.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end }}

{{/* Whether the master runs its Kubernetes integration (it needs the chart's node agent pods to find agents). */}}
{{- define "warren.masterKubernetes" -}}
{{- if and .Values.master.kubernetesApi.enabled .Values.nodeAgent.enabled }}true{{ end }}
{{- end }}

{{/* The node agent pods' label selector, as the master's WARREN_KUBERNETES_AGENT_SELECTOR. */}}
{{- define "warren.nodeAgentSelector" -}}
{{- $labels := include "warren.selectorLabels" (dict "root" . "component" "node-agent") | fromYaml }}
{{- $terms := list }}
{{- range $key := keys $labels | sortAlpha }}{{ $terms = append $terms (printf "%s=%s" $key (get $labels $key)) }}{{ end }}
{{- join "," $terms }}
{{- end }}

{{- define "warren.serviceAccountName" -}}
{{- if .root.Values.serviceAccount.create }}
{{- include "warren.componentName" . }}
{{- else }}
{{- "default" }}
{{- end }}
{{- end }}

{{/* Optional scheduling fields of a pod spec, from a component's values. */}}
{{- define "warren.scheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- end }}
