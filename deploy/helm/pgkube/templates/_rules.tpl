{{/*
The manager's RBAC rules, as deploy/rbac.yaml (which explains each) splits them in
deploy/namespaced/: the rules of a namespace it watches, and the cluster-scoped ones.
*/}}

{{- define "pgkube.namespacedRules" -}}
- apiGroups: ["db.example.com"]
  resources: ["postgresqlclusters"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["db.example.com"]
  resources: ["postgresqlbackups"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["db.example.com"]
  resources: ["postgresqlrestores"]
  verbs: ["list", "watch", "create"]
- apiGroups: ["db.example.com"]
  resources: ["postgresqlclusters/status", "postgresqlbackups/status", "postgresqlrestores/status"]
  verbs: ["patch"]
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["list", "watch", "create", "patch"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["list", "watch", "create", "patch"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "delete"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "patch"]
- apiGroups: [""]
  resources: ["pods/log"]
  verbs: ["get"]
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["list", "watch", "patch"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["list"]
{{- end }}

{{/* The storage class of a volume it expands; with a certificate it manages, the caBundle of its CRDs and admission webhook. */}}
{{- define "pgkube.clusterScopedRules" -}}
- apiGroups: ["storage.k8s.io"]
  resources: ["storageclasses"]
  verbs: ["get"]
{{- if eq .Values.webhook.certificate.source "pgkube" }}
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  resourceNames:
    - postgresqlclusters.db.example.com
    - postgresqlbackups.db.example.com
    - postgresqlrestores.db.example.com
  verbs: ["get", "patch"]
- apiGroups: ["admissionregistration.k8s.io"]
  resources: ["mutatingwebhookconfigurations"]
  resourceNames: ["pgkube"]
  verbs: ["get", "patch"]
{{- end }}
{{- end }}
