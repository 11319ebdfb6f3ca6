# The Keelgate image: one image for the operator (`keelgate operator`, the default command) and
# for step pods (the operator starts them with `keelgate step ...`). Step pods run as uid 65532
# with a read-only root filesystem and an emptyDir at /tmp, so nothing here expects to write
# anywhere but /tmp. tests/test_dockerfile.py holds this file to its rules; tests/test_image.py
# builds and runs the wheel it installs. See docs/install.md.

# ---- builder: the keelgate wheel, from the package's sources only -------------------------------
FROM python:3.11-slim-bookworm AS builder

WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
RUN python -m pip wheel --no-cache-dir --disable-pip-version-check --no-deps \
      --wheel-dir /dist .

# ---- the image: the wheel and its dependencies, no compiler, no sources -------------------------
FROM python:3.11-slim-bookworm

ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="keelgate" \
      org.opencontainers.image.description="Runs AI agent loops durably on Kubernetes: a WRITE never runs twice and never runs unapproved." \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/keelgate/keelgate" \
      org.opencontainers.image.base.name="docker.io/library/python:3.11-slim-bookworm"

# The user step pods run as (keelgate.kube.resources.STEP_USER); HOME is the writable /tmp.
# --no-log-init: no lastlog/faillog entry, which for a uid this high is a large file in a layer.
RUN groupadd --gid 65532 keelgate \
 && useradd --uid 65532 --gid 65532 --home-dir /tmp --no-create-home --no-log-init \
      --shell /usr/sbin/nologin keelgate

# A virtual environment without pip or setuptools, filled by the base image's pip from wheels
# only (nothing is compiled here). pip byte-compiles as it installs: nothing is written at run
# time. The wheel leaves with the layer's last command.
COPY --from=builder /dist/keelgate-*.whl /tmp/dist/
RUN python -m venv --without-pip /opt/keelgate \
 && python -m pip --python /opt/keelgate/bin/python install --no-cache-dir \
      --disable-pip-version-check --only-binary=:all: "$(echo /tmp/dist/keelgate-*.whl)[operator,openai,anthropic,mcp,postgres,tracing]" \
 && rm -rf /tmp/dist \
 && /opt/keelgate/bin/keelgate --version

ENV PATH="/opt/keelgate/bin:${PATH}" \
    HOME=/tmp \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

WORKDIR /tmp
USER 65532:65532
# /metrics, /healthz and /readyz of `keelgate operator` (probes, not a HEALTHCHECK).
EXPOSE 8080
ENTRYPOINT ["keelgate"]
CMD ["operator"]
