{{/* Names and labels shared by every template. */}}

{{/* The prefix of every name the chart makes, cluster-scoped ones too (two releases in one
     cluster each have their own): fullnameOverride, else the release's name. */}}
{{- define "keelgate.fullname" -}}
{{- default .Release.Name .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "keelgate.labels" -}}
app.kubernetes.io/name: keelgate
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "keelgate.selector" -}}
app.kubernetes.io/name: keelgate
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "keelgate.serviceAccount" -}}
{{- if .Values.serviceAccount.create -}}
{{ default (printf "%s-operator" (include "keelgate.fullname" .)) .Values.serviceAccount.name }}
{{- else -}}
{{ default "default" .Values.serviceAccount.name }}
{{- end -}}
{{- end -}}

{{- define "keelgate.image" -}}
{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}
{{- end -}}

{{- define "keelgate.storeSecretName" -}}
{{- if .Values.store.existingSecret.name -}}
{{ .Values.store.existingSecret.name }}
{{- else -}}
{{ include "keelgate.fullname" . }}-store
{{- end -}}
{{- end -}}

{{- define "keelgate.storeSecretKey" -}}
{{- if .Values.store.existingSecret.name -}}
{{ .Values.store.existingSecret.key }}
{{- else -}}
url
{{- end -}}
{{- end -}}

{{/* The platform's step-pod settings, as the operator reads them (--step-pod-defaults). */}}
{{- define "keelgate.stepPods" -}}
{{- toYaml .Values.stepPods }}
{{- end }}

{{/* CEL for the admission policies: whether an update of an AgentRun leaves what its step pods
     do as it was, that is every field of its spec but budget, pricing, suspend, schedule and the
     ticks' history limits (false on a create). tests/test_admission.py holds this list to the
     AgentRun's fields: a new field is one of these until said otherwise. */}}
{{- define "keelgate.sameWork" -}}
oldObject != null &&
object.spec.?loop == oldObject.spec.?loop && object.spec.?goal == oldObject.spec.?goal &&
object.spec.?model == oldObject.spec.?model && object.spec.?tools == oldObject.spec.?tools &&
object.spec.?allowedSideEffects == oldObject.spec.?allowedSideEffects &&
object.spec.?step == oldObject.spec.?step
{{- end -}}

{{/* A binding's scope for the policies on AgentRuns, which let this release's operator through
     (its ticks): with operator.watchNamespaces, the namespaces this release drives, so that
     another release's policies never stand in front of this release's operator; else every
     namespace. */}}
{{- define "keelgate.watchedNamespaces" -}}
{{- with .Values.operator.watchNamespaces }}
  matchResources:
    namespaceSelector:
      matchExpressions:
        - key: kubernetes.io/metadata.name
          operator: In
          values: {{ toJson . }}
{{- end }}
{{- end -}}

{{/* The operator's sinks, as --notify-config reads them (docs/notifications.md): its name at
     the head of every event's source, the ConfigMap that keeps how far delivery has come, and
     each sink with its headers Secret's mount. */}}
{{- define "keelgate.notifyConfig" -}}
{{- $fullname := include "keelgate.fullname" . -}}
source: {{ printf "%s/%s" .Release.Namespace $fullname | quote }}
state: {{ printf "%s/%s-notify-state" .Release.Namespace $fullname | quote }}
queueSize: {{ .Values.notifications.queueSize }}
sinks:
{{- range .Values.notifications.sinks }}
  - name: {{ .name | quote }}
    url: {{ .url | quote }}
    types: {{ toJson (default (list) .types) }}
    mode: {{ default "structured" .mode | quote }}
    timeoutSeconds: {{ hasKey . "timeoutSeconds" | ternary .timeoutSeconds 5 }}
    retryForSeconds: {{ hasKey . "retryForSeconds" | ternary .retryForSeconds 600 }}
    includeArguments: {{ default false .includeArguments }}
    {{- if .headersSecret }}
    headersDir: {{ printf "/etc/keelgate-notify/headers/%s" .name | quote }}
    {{- end }}
{{- end }}
{{- end -}}
