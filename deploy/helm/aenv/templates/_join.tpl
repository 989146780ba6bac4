{{- /* The pod that mints a join token: the same for the Job and the CronJob. */}}
{{- define "aenv.joinPod" -}}
{{- $root := .root -}}
serviceAccountName: {{ include "aenv.fullname" $root }}-join
restartPolicy: OnFailure
enableServiceLinks: false
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  fsGroup: 65532
  seccompProfile:
    type: RuntimeDefault
containers:
  - name: join-token
    image: {{ include "aenv.image" $root }}
    imagePullPolicy: {{ $root.Values.image.pullPolicy }}
    command:
      - sh
      - -ec
      - |
        umask 077
        sa=/var/run/secrets/kubernetes.io/serviceaccount
        # The servers may still be starting (an install starts everything
        # at once). The admin key is $AENV_API_KEY; the token goes to a
        # file, never to the log.
        i=0
        until aenv cluster join-command --url "$API_URL" {{ if eq (include "aenv.apiScheme" $root) "https" }}{{ if eq $root.Values.apiTLS.mode "cluster-ca" }}--ca-file /etc/aenv/ca/ca.crt {{ end }}{{ end }}--ttl "$TTL" \
            --description "node agents of the Kubernetes DaemonSet {{ include "aenv.fullname" $root }}-node" >/tmp/join 2>/tmp/err; do
          i=$((i + 1))
          [ "$i" -lt 90 ] || { cat /tmp/err >&2; exit 1; }
          echo "waiting for the API at $API_URL: $(cat /tmp/err)"
          sleep 10
        done
        token=$(sed -n 's/.* --token \([^ ]*\).*/\1/p' /tmp/join)
        hash=$(sed -n 's/.* --ca-hash \([^ ]*\).*/\1/p' /tmp/join)
        [ -n "$token" ] && [ -n "$hash" ] || { echo "aenv cluster join-command printed no token and CA hash" >&2; exit 1; }
        printf '{"data":{"token":"%s","ca-hash":"%s"}}' "$(printf %s "$token" | base64 -w0)" "$(printf %s "$hash" | base64 -w0)" >/tmp/body
        # The service account's token in wget's settings file, not on its
        # command line.
        printf 'header = Authorization: Bearer %s\n' "$(cat "$sa/token")" >/tmp/wgetrc
        WGETRC=/tmp/wgetrc wget -nv -O /dev/null --method=PATCH --header='Content-Type: application/merge-patch+json' \
          --body-file=/tmp/body --ca-certificate="$sa/ca.crt" \
          "https://kubernetes.default.svc/api/v1/namespaces/$(cat "$sa/namespace")/secrets/$SECRET"
        rm -f /tmp/join /tmp/body /tmp/wgetrc
        echo "Secret $SECRET holds a join token valid for $TTL, and the CA's hash $hash"
    env:
      - name: API_URL
        value: {{ .apiURL | quote }}
      - name: TTL
        value: {{ $root.Values.join.ttl | quote }}
      - name: SECRET
        value: {{ .secret | quote }}
      - name: AENV_API_KEY
        valueFrom:
          secretKeyRef:
            name: {{ include "aenv.clusterSecret" $root }}
            key: api-key
    resources:
      requests:
        cpu: 10m
        memory: 32Mi
    securityContext:
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      capabilities:
        drop: [ALL]
    volumeMounts:
      - name: tmp
        mountPath: /tmp
      - name: ca
        mountPath: /etc/aenv/ca
        readOnly: true
volumes:
  - name: tmp
    emptyDir:
      medium: Memory
  # The CA's certificate only, to check the API's.
  - name: ca
    secret:
      secretName: {{ include "aenv.caSecret" $root }}
      items:
        - key: {{ include "aenv.caCertKey" $root }}
          path: ca.crt
{{- end }}
