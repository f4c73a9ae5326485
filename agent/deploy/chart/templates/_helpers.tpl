{{- define "agent.labels" -}}
app.kubernetes.io/name: gpu-autoscaler-agent
app.kubernetes.io/part-of: gpu-autoscaler
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{- define "functions.labels" -}}
app.kubernetes.io/name: gpu-autoscaler-functions
app.kubernetes.io/part-of: gpu-autoscaler
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}
