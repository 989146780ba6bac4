# aenv server image: the E2B-compatible API and sandbox proxy, running gVisor
# sandboxes inside this (privileged) container.
#
#   docker build -t IMAGE .
#   docker run --privileged --cgroupns=host -v aenv-data:/var/lib/aenv -p 8000:8000 IMAGE
#
# (add -d --name CONTAINER to keep it in the background.)
#
# --privileged and --cgroupns=host: sandboxes need namespaces, mounts,
# nftables and the host's cgroup tree. The volume keeps the API key,
# templates and snapshots; the first start builds the base template into it
# from Debian packages (a few minutes, once). The API key is generated at
# first start into /var/lib/aenv/secrets/api-key inside the volume:
#
#   docker exec CONTAINER cat /var/lib/aenv/secrets/api-key
#
# or set your own with -e AENV_API_KEY=e2b_<hex>. More `aenv server` flags go
# after the image name (`... IMAGE --warm-pool 4 --domain sbx.example.com`;
# `docker run --rm IMAGE --help` lists them). Then point the E2B SDK at it:
#
#   export E2B_API_URL=http://localhost:8000 E2B_SANDBOX_URL=http://localhost:8000
#   export E2B_API_KEY=$(docker exec CONTAINER cat /var/lib/aenv/secrets/api-key)
#
# The Helm chart (deploy/helm/aenv) runs every part of a cluster from this
# image: `aenv server --local-node=false`, `aenv node`, `aenv etcd`, and a
# Job that keeps the nodes' join token (wget, below, writes it to a Secret).

ARG GO_VERSION=1.26

# aenv and envd, static (envd runs inside sandboxes, whatever their libc).
FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o /out/aenv ./cmd/aenv \
 && CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o /out/envd ./cmd/envd

# runsc from the pinned gVisor release (scripts/install-deps.sh pins the same
# one). It must be built without cgo: a dynamic runsc fails at every start.
FROM golang:${GO_VERSION}-bookworm AS runsc
ARG RUNSC_VERSION=v0.0.0-20260905035102-160fafc42237
RUN CGO_ENABLED=0 GOBIN=/out go install gvisor.dev/gvisor/runsc@${RUNSC_VERSION}

FROM debian:bookworm-slim
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      iproute2 nftables debootstrap ca-certificates e2fsprogs wget \
 && rm -rf /var/lib/apt/lists/*
# envd beside aenv: that is where the server looks for it.
COPY --from=build /out/aenv /out/envd /usr/local/bin/
COPY --from=runsc /out/runsc /usr/local/bin/runsc
VOLUME /var/lib/aenv
EXPOSE 8000
STOPSIGNAL SIGTERM
ENTRYPOINT ["aenv", "server"]
