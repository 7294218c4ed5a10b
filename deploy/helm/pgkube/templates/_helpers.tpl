{{/* Names, labels and the values every template shares. */}}

{{- define "pgkube.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release name when it contains the chart's name, else <release>-<name>. */}}
{{- define "pgkube.fullname" -}}
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

{{/* Labels of every object: deploy/'s, and Helm's. */}}
{{- define "pgkube.labels" -}}
app.kubernetes.io/name: {{ include "pgkube.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* Labels of the manager's pods and of what selects them. */}}
{{- define "pgkube.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pgkube.name" . }}
app.kubernetes.io/component: manager
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "pgkube.managerLabels" -}}
{{ include "pgkube.labels" . }}
app.kubernetes.io/component: manager
{{- end }}

{{/* The manager's image: repository@digest, or repository:tag. */}}
{{- define "pgkube.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The namespaces watched, comma-separated; empty for every namespace. */}}
{{- define "pgkube.watchNamespaces" -}}
{{- if .Values.watchNamespaces }}
{{- join "," .Values.watchNamespaces }}
{{- else if eq .Values.rbac.scope "namespace" }}
{{- .Release.Namespace }}
{{- end }}
{{- end }}

{{- define "pgkube.webhookService" -}}
{{- printf "%s-webhook" (include "pgkube.fullname" .) }}
{{- end }}

{{- define "pgkube.certificateSecret" -}}
{{- default (printf "%s-webhook-cert" (include "pgkube.fullname" .)) .Values.webhook.certificate.secretName }}
{{- end }}

{{/* The MutatingWebhookConfiguration's name: the one a manager managing its certificate trusts in. */}}
{{- define "pgkube.admissionName" -}}
{{- include "pgkube.fullname" . }}
{{- end }}

{{/* Stops the render on values that cannot work together. */}}
{{- define "pgkube.validate" -}}
{{- $source := .Values.webhook.certificate.source }}
{{- if not (has $source (list "pgkube" "certManager" "secret")) }}
{{- fail (printf "webhook.certificate.source is %q: pgkube, certManager or secret" $source) }}
{{- end }}
{{- if not (has .Values.rbac.scope (list "cluster" "namespace")) }}
{{- fail (printf "rbac.scope is %q: cluster or namespace" .Values.rbac.scope) }}
{{- end }}
{{- if and (eq $source "pgkube") .Values.admissionWebhook.enabled (ne (include "pgkube.admissionName" .) "pgkube") }}
{{- fail (printf "webhook.certificate.source=pgkube: the manager sets its CA in the MutatingWebhookConfiguration named pgkube only, and this release's would be %s. Install the release as `pgkube`, or use webhook.certificate.source=certManager or secret" (include "pgkube.admissionName" .)) }}
{{- end }}
{{- if and (eq $source "secret") (not .Values.webhook.certificate.secretName) }}
{{- fail "webhook.certificate.source=secret: name your kubernetes.io/tls Secret in webhook.certificate.secretName" }}
{{- end }}
{{- end }}
