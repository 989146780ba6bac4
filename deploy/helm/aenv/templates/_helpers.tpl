{{/* Names, labels and the values derived from several settings. */}}

{{- define "aenv.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "aenv.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "aenv.labels" -}}
app.kubernetes.io/name: {{ include "aenv.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* Selector labels of one component: (dict "root" $ "component" "server"). */}}
{{- define "aenv.selector" -}}
app.kubernetes.io/name: {{ include "aenv.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "aenv.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "aenv.clusterSecret" -}}
{{- default (printf "%s-cluster" (include "aenv.fullname" .)) .Values.clusterSecrets.name -}}
{{- end -}}

{{- define "aenv.caSecret" -}}
{{- default (printf "%s-ca" (include "aenv.fullname" .)) .Values.ca.secretName -}}
{{- end -}}

{{/* The CA Secret's keys: cert-manager writes tls.crt and tls.key. */}}
{{- define "aenv.caCertKey" -}}
{{- if eq .Values.ca.provider "cert-manager" -}}tls.crt{{- else -}}ca.crt{{- end -}}
{{- end -}}
{{- define "aenv.caKeyKey" -}}
{{- if eq .Values.ca.provider "cert-manager" -}}tls.key{{- else -}}ca.key{{- end -}}
{{- end -}}

{{- define "aenv.joinSecret" -}}
{{- if eq .Values.join.mode "secret" -}}
{{- required "join.existingSecret: the Secret holding the join token and the CA's hash (join.mode secret)" .Values.join.existingSecret -}}
{{- else -}}
{{- printf "%s-join" (include "aenv.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "aenv.serverService" -}}
{{- printf "%s-server" (include "aenv.fullname" .) -}}
{{- end -}}

{{/* The servers' Service as clients in the cluster name it. */}}
{{- define "aenv.serverHost" -}}
{{- printf "%s.%s.svc" (include "aenv.serverService" .) .Release.Namespace -}}
{{- end -}}

{{- define "aenv.apiScheme" -}}
{{- if eq .Values.apiTLS.mode "insecure-http" -}}http{{- else -}}https{{- end -}}
{{- end -}}

{{- define "aenv.apiTLSSecret" -}}
{{- if .Values.apiTLS.secretName -}}
{{- .Values.apiTLS.secretName -}}
{{- else if .Values.apiTLS.certManager.enabled -}}
{{- printf "%s-api-tls" (include "aenv.fullname" .) -}}
{{- else -}}
{{- fail "apiTLS.secretName: the kubernetes.io/tls Secret the API serves (apiTLS.mode secret), or apiTLS.certManager.enabled" -}}
{{- end -}}
{{- end -}}

{{- define "aenv.etcdName" -}}
{{- printf "%s-etcd" (include "aenv.fullname" .) -}}
{{- end -}}

{{/* etcd's client URLs, comma-separated. */}}
{{- define "aenv.etcdEndpoints" -}}
{{- if .Values.etcd.enabled -}}
{{- $name := include "aenv.etcdName" . -}}
{{- $eps := list -}}
{{- range $i := until (int .Values.etcd.replicas) -}}
{{- $eps = append $eps (printf "https://%s-%d.%s.%s.svc:2379" $name $i $name $.Release.Namespace) -}}
{{- end -}}
{{- join "," $eps -}}
{{- else -}}
{{- $eps := required "etcd.external.endpoints: the etcd the cluster uses (etcd.enabled is false)" .Values.etcd.external.endpoints -}}
{{- join "," $eps -}}
{{- end -}}
{{- end -}}

{{/* --store's value ("" for none). */}}
{{- define "aenv.storeURL" -}}
{{- if .Values.store.url -}}
{{- .Values.store.url -}}
{{- else if .Values.store.s3.bucket -}}
{{- $s3 := .Values.store.s3 -}}
{{- $q := list -}}
{{- if $s3.endpoint -}}{{- $q = append $q (printf "endpoint=%s" (urlquery $s3.endpoint)) -}}{{- end -}}
{{- if $s3.region -}}{{- $q = append $q (printf "region=%s" (urlquery $s3.region)) -}}{{- end -}}
{{- if $s3.pathStyle -}}{{- $q = append $q "path_style=true" -}}{{- end -}}
{{- printf "s3://%s/%s" $s3.bucket (trimAll "/" $s3.prefix) | trimSuffix "/" -}}
{{- if $q -}}?{{ join "&" $q }}{{- end -}}
{{- end -}}
{{- end -}}

{{/* The store's credentials as environment variables. */}}
{{- define "aenv.storeEnv" -}}
{{- if .Values.store.s3.existingSecret }}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ .Values.store.s3.existingSecret }}
      key: {{ .Values.store.s3.accessKeyIdKey }}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .Values.store.s3.existingSecret }}
      key: {{ .Values.store.s3.secretAccessKeyKey }}
{{- end }}
{{- end -}}

{{/* Flags for an external etcd of its own CA. */}}
{{- define "aenv.etcdTLSArgs" -}}
{{- if and (not .Values.etcd.enabled) .Values.etcd.external.tlsSecret }}
- --etcd-ca=/etc/aenv/etcd/ca.crt
- --etcd-cert=/etc/aenv/etcd/tls.crt
- --etcd-key=/etc/aenv/etcd/tls.key
{{- end }}
{{- end -}}

{{- define "aenv.etcdTLSMount" -}}
{{- if and (not .Values.etcd.enabled) .Values.etcd.external.tlsSecret }}
- name: etcd-tls
  mountPath: /etc/aenv/etcd
  readOnly: true
{{- end }}
{{- end -}}

{{- define "aenv.etcdTLSVolume" -}}
{{- if and (not .Values.etcd.enabled) .Values.etcd.external.tlsSecret }}
- name: etcd-tls
  secret:
    secretName: {{ .Values.etcd.external.tlsSecret }}
    defaultMode: 0400
{{- end }}
{{- end -}}
