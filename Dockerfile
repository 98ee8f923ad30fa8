# Saga Admin's image: one entrypoint for the web, the worker, migrations and any management command
# (deploy/docker/entrypoint.sh):
#   docker build -t saga-admin --build-arg SAGA_REVISION="$(git rev-parse HEAD)" .
#   docker run --env-file .env saga-admin migrate      # then: web | worker | create_agent_key ...
# docs/DEPLOY.md has the whole path; compose.yaml and deploy/kubernetes/ run this image.
#
# The Python steps are deploy/docker/install.sh, which tests/test_install.py also runs (this
# machine has no container engine): what this file adds is the base image, the user and the ports.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY . .
# The venv, the collected static files, the Procfile and the entrypoint, all under /opt/saga.
RUN sh deploy/docker/install.sh /src /opt/saga

# The final stage: the same slim base (no compilers, no build tools, no source tree), the install
# copied in, owned by root and only readable by the unprivileged user that runs it.
FROM ${PYTHON_IMAGE}
ARG SAGA_UID=10001
# The commit the image is built from, which saga_build_info reports (the image has no git checkout
# to read it from): docker build --build-arg SAGA_REVISION="$(git rev-parse HEAD)" .
ARG SAGA_REVISION=unknown
RUN groupadd --system --gid "${SAGA_UID}" saga \
    && useradd --system --uid "${SAGA_UID}" --gid saga --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin saga
COPY --from=build /opt/saga /opt/saga
ENV PATH=/opt/saga/venv/bin:$PATH \
    DJANGO_SETTINGS_MODULE=saga_admin.settings \
    STATIC_ROOT=/opt/saga/static \
    PORT=8000 \
    SAGA_REVISION=${SAGA_REVISION} \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /opt/saga
USER ${SAGA_UID}:${SAGA_UID}
EXPOSE 8000
# One image, one check of what each container runs (the entrypoint exports SAGA_PROCESS): a web
# container by GET /livez (liveness only: a database outage restarts no container), a worker
# container by its worker's heartbeat in Redis, a one-shot command (migrate) healthy while it runs.
HEALTHCHECK --interval=30s --timeout=10s --start-period=30s --retries=3 \
    CMD ["python", "-m", "saga_admin.probe"]
ENTRYPOINT ["/opt/saga/entrypoint.sh"]
CMD ["web"]
