# brokerd in a container: one image, one daemon per container (see docker-compose.yml).
FROM python:3.11-slim
WORKDIR /opt/brokerd
COPY pyproject.toml README.md ./
COPY protocol ./protocol
COPY brokerd ./brokerd
RUN pip install --no-cache-dir .
EXPOSE 4022
ENTRYPOINT ["brokerd"]
