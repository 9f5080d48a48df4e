{{/*
Names and labels shared by every template of the chart.
*/}}

{{- define "fjord.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release-derived name of the chart's own objects (operator Deployment, RBAC, ...). */}}
{{- define "fjord.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "fjord.operatorName" -}}
{{- printf "%s-operator" (include "fjord.fullname" .) -}}
{{- end -}}

{{- define "fjord.chartLabel" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object the chart installs. */}}
{{- define "fjord.labels" -}}
helm.sh/chart: {{ include "fjord.chartLabel" . }}
app.kubernetes.io/name: {{ include "fjord.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector of the operator's pods (immutable once installed: keep it small). */}}
{{- define "fjord.operatorSelectorLabels" -}}
app.kubernetes.io/name: {{ include "fjord.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "fjord.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "fjord.operatorName" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The namespaces the operator reconciles (a list; the release namespace when none is given). */}}
{{- define "fjord.watchNamespaces" -}}
{{- if .Values.operator.watchNamespaces -}}
{{- toJson .Values.operator.watchNamespaces -}}
{{- else -}}
{{- toJson (list .Release.Namespace) -}}
{{- end -}}
{{- end -}}

{{- define "fjord.operatorImage" -}}
{{- printf "%s:%s" .Values.operator.image.repository (default .Chart.AppVersion .Values.operator.image.tag) -}}
{{- end -}}

{{/*
The rules the operator needs in every namespace it reconciles. Read by the Role (one per watched
namespace) or the ClusterRole (watchAllNamespaces). docs/kubernetes.md explains each rule.
*/}}
{{- define "fjord.operatorNamespacedRules" -}}
- apiGroups: ["fjord.io"]
  resources: ["fjordclusters", "fjordtopics", "fjordusers"]
  verbs: ["get", "list", "watch", "patch", "update"]
- apiGroups: ["fjord.io"]
  resources: ["fjordclusters/status", "fjordtopics/status", "fjordusers/status"]
  verbs: ["get", "patch", "update"]
- apiGroups: ["fjord.io"]
  resources: ["fjordclusters/finalizers", "fjordtopics/finalizers", "fjordusers/finalizers"]
  verbs: ["update"]
- apiGroups: ["apps"]
  resources: ["statefulsets", "deployments"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: [""]
  resources: ["services", "configmaps"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: [""]
  resources: ["pods"]
  # delete: rolling restarts of brokers (OnDelete StatefulSet; a changed template or a
  # certificate renewal), one pod at a time through the safe roller.
  # patch: the fjord.io/rack annotation of broker pods (rack awareness).
  verbs: ["get", "list", "watch", "delete", "patch"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end -}}
