# Conveyor: one image for every role (scheduler, worker, autoscaler, `up`, the operator
# commands). Slim, built in two stages (no compiler or build cache in the result), run as a
# non-root user, with `conveyor` as the entry point:
#   docker build -t conveyor:0.1.0 .
#   docker run --rm conveyor:0.1.0 worker --queues=default --concurrency=4
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
 && pip wheel --no-cache-dir --wheel-dir /wheels /wheels/conveyor-*.whl

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    CONVEYOR_HOME=/var/lib/conveyor
# Two users. `conveyor` (10001, the default USER) runs the scheduler, the autoscaler,
# `conveyor up` and the operator commands. `conveyor-task` (10002) is for task code: the
# compose file and the Kubernetes manifests start workers as root with every capability
# dropped but SETUID, SETGID and KILL, and `--uid=conveyor-task`, so a task cannot read,
# trace, signal or re-limit its worker (README: Security model). The home is 0755 so that
# such a root worker, which has no CAP_DAC_OVERRIDE, can still look for conveyor.toml in it.
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /var/lib/conveyor \
      --shell /usr/sbin/nologin conveyor \
 && chmod 0755 /var/lib/conveyor \
 && useradd --system --uid 10002 --user-group --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin conveyor-task
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links=/wheels conveyor \
 && rm -rf /wheels
USER 10001:10001
WORKDIR /var/lib/conveyor
# 9100: a worker's /metrics; 9400: the autoscaler's /metrics and queue-depth API
EXPOSE 9100 9300 9400
ENTRYPOINT ["conveyor"]
CMD ["up"]
