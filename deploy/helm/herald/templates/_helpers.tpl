{{/* The release's objects are named <release>-herald unless the release is named herald. */}}
{{- define "herald.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "herald.selectorLabels" -}}
app.kubernetes.io/name: {{ default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "herald.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "herald.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "herald.secretName" -}}
{{- default (include "herald.fullname" .) .Values.existingSecret -}}
{{- end -}}

{{- define "herald.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "herald.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Checks that need more than the schema: what a mode requires. */}}
{{- define "herald.validate" -}}
{{- if not .Values.existingSecret -}}
{{- if lt (len .Values.adminToken) 32 -}}
{{- fail "adminToken must be at least 32 characters (openssl rand -hex 24), or set existingSecret" -}}
{{- end -}}
{{- if and (eq .Values.mode "postgres") (not (hasPrefix "postgres" .Values.databaseUrl)) -}}
{{- fail "mode postgres needs databaseUrl (postgres://user:password@host:5432/db), or set existingSecret" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The pod template both workloads share. */}}
{{- define "herald.pod" -}}
metadata:
  labels:
    {{- include "herald.selectorLabels" . | nindent 4 }}
    {{- with .Values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    # A change of configuration rolls the pods.
    checksum/config: {{ include (print $.Template.BasePath "/configmap.yaml") . | sha256sum }}
    {{- with .Values.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  serviceAccountName: {{ include "herald.serviceAccountName" . }}
  automountServiceAccountToken: false
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml .Values.podSecurityContext | nindent 4 }}
  terminationGracePeriodSeconds: {{ .Values.terminationGracePeriodSeconds }}
  containers:
    - name: herald
      image: "{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}"
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      args: ["serve", "--config", "/etc/herald/herald.toml"]
      securityContext:
        {{- toYaml .Values.securityContext | nindent 8 }}
      ports:
        - name: api
          containerPort: 8080
          protocol: TCP
        - name: admin
          containerPort: 9090
          protocol: TCP
      env:
        - name: HERALD_SERVER_LISTEN
          value: "0.0.0.0:8080"
        - name: HERALD_SERVER_ADMIN_LISTEN
          value: "0.0.0.0:9090"
        - name: HERALD_PLUGINS_DIR
          value: /var/lib/herald/plugins.d
        - name: HERALD_PLUGINS_CACHE_DIR
          value: /var/lib/herald/plugins.cache
        - name: HERALD_SERVER_ADMIN_TOKEN
          valueFrom:
            secretKeyRef:
              name: {{ include "herald.secretName" . }}
              key: {{ .Values.existingSecretKeys.adminToken }}
        - name: HERALD_SECRETS_KEY
          valueFrom:
            secretKeyRef:
              name: {{ include "herald.secretName" . }}
              key: {{ .Values.existingSecretKeys.secretsKey }}
              optional: true
        {{- if eq .Values.mode "postgres" }}
        - name: HERALD_STORE_URL
          valueFrom:
            secretKeyRef:
              name: {{ include "herald.secretName" . }}
              key: {{ .Values.existingSecretKeys.databaseUrl }}
        # Each node's id is its pod's name: a restarted pod keeps none, a new one joins.
        - name: HERALD_CLUSTER_NODE_ID
          valueFrom:
            fieldRef:
              fieldPath: metadata.name
        {{- else }}
        - name: HERALD_STORE_URL
          value: sqlite:///var/lib/herald/herald.db
        - name: HERALD_CLUSTER_NODE_ID
          valueFrom:
            fieldRef:
              fieldPath: metadata.name
        {{- end }}
        {{- with .Values.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      startupProbe:
        httpGet:
          path: /healthz
          port: admin
        periodSeconds: 2
        failureThreshold: 60
      livenessProbe:
        httpGet:
          path: /healthz
          port: admin
        periodSeconds: 10
        timeoutSeconds: 3
        failureThreshold: 3
      readinessProbe:
        httpGet:
          path: /readyz
          port: admin
        periodSeconds: 5
        timeoutSeconds: 3
        failureThreshold: 2
      resources:
        {{- toYaml .Values.resources | nindent 8 }}
      volumeMounts:
        - name: config
          mountPath: /etc/herald
          readOnly: true
        - name: data
          mountPath: /var/lib/herald
        - name: tmp
          mountPath: /tmp
  volumes:
    - name: config
      configMap:
        name: {{ include "herald.fullname" . }}
    - name: tmp
      emptyDir: {}
    {{- if eq .Values.mode "postgres" }}
    - name: data
      {{- if .Values.plugins.existingClaim }}
      persistentVolumeClaim:
        claimName: {{ .Values.plugins.existingClaim }}
      {{- else }}
      emptyDir: {}
      {{- end }}
    {{- end }}
  {{- with .Values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- if eq .Values.mode "postgres" }}
  topologySpreadConstraints:
    - maxSkew: 1
      topologyKey: kubernetes.io/hostname
      whenUnsatisfiable: {{ .Values.topologySpread.nodes }}
      labelSelector:
        matchLabels:
          {{- include "herald.selectorLabels" . | nindent 10 }}
    - maxSkew: 1
      topologyKey: topology.kubernetes.io/zone
      whenUnsatisfiable: {{ .Values.topologySpread.zones }}
      labelSelector:
        matchLabels:
          {{- include "herald.selectorLabels" . | nindent 10 }}
  {{- end }}
{{- end -}}
