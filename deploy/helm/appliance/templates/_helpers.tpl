{{- define "appliance.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "appliance.fullname" -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "appliance.labels" -}}
app.kubernetes.io/name: {{ include "appliance.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "appliance.selector" -}}
app.kubernetes.io/name: {{ include "appliance.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The StatefulSet's pods (each runs its shard of the cameras), and the gateway's: the
component keeps the two sets apart, so no Service, controller or budget selects both. */}}
{{- define "appliance.replicaSelector" -}}
{{ include "appliance.selector" . }}
app.kubernetes.io/component: replica
{{- end -}}

{{- define "appliance.gatewaySelector" -}}
{{ include "appliance.selector" . }}
app.kubernetes.io/component: gateway
{{- end -}}

{{/* The headless Service that names each replica: <fullname>-N.<this>.<namespace>.svc */}}
{{- define "appliance.replicasService" -}}
{{- printf "%s-replicas" (include "appliance.fullname" .) -}}
{{- end -}}

{{/* The gateway's --replicas: replica I is the I-th address, so the gateway's placement
agrees with each pod's APPLIANCE_SHARD=auto/<replicaCount> (its ordinal out of the count). */}}
{{- define "appliance.replicaAddresses" -}}
{{- $fullname := include "appliance.fullname" . -}}
{{- $service := include "appliance.replicasService" . -}}
{{- $addresses := list -}}
{{- range $i := until (int .Values.replicaCount) -}}
{{- $scheme := ternary "https://" "" (not (empty $.Values.tls.secretName)) -}}
{{- $addresses = append $addresses (printf "%s%s-%d.%s.%s.svc:8080" $scheme $fullname $i $service $.Release.Namespace) -}}
{{- end -}}
{{- join "," $addresses -}}
{{- end -}}

{{/* server.allowed_hosts: the names the pods are called by in the cluster (the API
Service, each replica through the headless Service, as the gateway dials them), after
those of config.server.allowed_hosts (an ingress's public name). Any other Host header is
refused (DNS rebinding); probes and Prometheus call pod IPs, which a 0.0.0.0 bind takes. */}}
{{- define "appliance.allowedHosts" -}}
{{- $fullname := include "appliance.fullname" . -}}
{{- $replicas := include "appliance.replicasService" . -}}
{{- $ns := .Release.Namespace -}}
{{- $server := default (dict) .Values.config.server -}}
{{- $hosts := default (list) (get $server "allowed_hosts") -}}
{{- /* Each name with no suffix too (a client in the namespace): `.<replicas>` is no
public domain, so a rebound name cannot end with it. */ -}}
{{- range $suffix := list "" (printf ".%s" $ns) (printf ".%s.svc" $ns) (printf ".%s.svc.%s" $ns $.Values.clusterDomain) -}}
{{- $hosts = append $hosts (printf ".%s%s" $replicas $suffix) -}}
{{- $hosts = append $hosts (printf "%s%s" $fullname $suffix) -}}
{{- end -}}
{{- toYaml (uniq $hosts) -}}
{{- end -}}

{{- define "appliance.secretName" -}}
{{- default (include "appliance.fullname" .) .Values.token.existingSecret -}}
{{- end -}}

{{/* The same token for the replicas and the gateway (the gateway sends it on to them),
and the key that seals the credentials of cameras added over the API in their state
folders (the replicas' and the gateway's store alike). */}}
{{- define "appliance.tokenEnv" -}}
{{- if or .Values.token.existingSecret .Values.token.value }}
- name: APPLIANCE_API_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "appliance.secretName" . }}
      key: token
{{- end }}
{{- if or .Values.stateKey.existingSecret .Values.stateKey.value }}
- name: APPLIANCE_STATE_KEY
  valueFrom:
    secretKeyRef:
      name: {{ default (include "appliance.fullname" .) .Values.stateKey.existingSecret }}
      key: state-key
{{- end }}
{{- end -}}

{{/* The probes' scheme: HTTPS when the API is served over TLS (kubelet does not check
the certificate of an HTTPS probe). */}}
{{- define "appliance.probeScheme" -}}
{{- if .Values.tls.secretName }}, scheme: HTTPS{{ end -}}
{{- end -}}

{{/* The TLS Secret (tls.secretName), mounted whole at /etc/appliance-tls: its ca.crt is
optional, and kubelet updates the files when cert-manager renews it. */}}
{{- define "appliance.tlsMount" -}}
{{- if .Values.tls.secretName -}}
- name: tls
  mountPath: /etc/appliance-tls
  readOnly: true
{{- end -}}
{{- end -}}

{{- define "appliance.tlsVolume" -}}
{{- if .Values.tls.secretName -}}
- name: tls
  secret:
    secretName: {{ .Values.tls.secretName }}
    defaultMode: 0400
{{- end -}}
{{- end -}}

{{/* Non-root, no privilege, a read-only root: the writes go to mounted volumes only. */}}
{{- define "appliance.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile: {type: RuntimeDefault}
{{- end -}}

{{- define "appliance.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities: {drop: ["ALL"]}
{{- end -}}

{{/* The appliance's config (and workflows) from the ConfigMap, at /etc/appliance. */}}
{{- define "appliance.configVolume" -}}
- name: config
  configMap:
    name: {{ include "appliance.fullname" . }}
    items:
      - {key: appliance.yaml, path: appliance.yaml}
      {{- range $name, $_ := .Values.workflows }}
      - {key: "workflow-{{ $name }}", path: "workflows/{{ $name }}"}
      {{- end }}
{{- end -}}

