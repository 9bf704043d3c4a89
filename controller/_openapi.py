"""The OpenAPI description of the daemon's HTTP API, served at ``/openapi.json``."""

from __future__ import annotations

from typing import Any

_ERROR = {"$ref": "#/components/schemas/Error"}


def _op(summary: str, ok: str, *errors: str, body: str | None = None) -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": summary,
        "responses": {
            ok: {"description": "done"},
            **{
                code: {
                    "description": "error",
                    "content": {"application/json": {"schema": _ERROR}},
                }
                for code in ("401", *errors)
            },
        },
    }
    if body is not None:
        op["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{body}"}}},
        }
    return op


_NAME = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}

OPENAPI: dict[str, Any] = {
    "openapi": "3.0.3",
    "info": {"title": "trio-replica-controller", "version": "1"},
    "components": {
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        "schemas": {
            "Error": {
                "type": "object",
                "properties": {
                    "error": {
                        "type": "object",
                        "properties": {
                            "type": {"type": "string"},
                            "message": {"type": "string"},
                            "problems": {"type": "array", "items": {"type": "string"}},
                        },
                    }
                },
            },
            "Backend": {
                "type": "object",
                "description": "BackendConfig and ReplicaConfig fields side by side; "
                "entrypoint is required, unknown fields are rejected",
                "required": ["entrypoint"],
                "properties": {
                    "entrypoint": {"type": "string"},
                    "init_args": {"type": "array"},
                    "init_kwargs": {"type": "object"},
                    "num_replicas": {"type": "integer", "minimum": 0},
                    "version": {"type": "string", "nullable": True},
                    "user_config": {},
                    "graceful_shutdown_timeout_s": {"type": "number"},
                    "start_timeout_s": {"type": "number"},
                    "resources": {"type": "object"},
                    "max_surge": {"type": "number"},
                    "max_unavailable": {"type": "number"},
                    "health_check_period_s": {"type": "number"},
                    "health_check_timeout_s": {"type": "number"},
                    "health_check_failure_threshold": {"type": "integer"},
                },
                "additionalProperties": False,
            },
            "Apply": {
                "type": "object",
                "properties": {
                    "backends": {
                        "type": "object",
                        "additionalProperties": {"$ref": "#/components/schemas/Backend"},
                    },
                    "prune": {"type": "boolean"},
                    "source": {"type": "string"},
                },
                "additionalProperties": False,
            },
        },
    },
    "security": [{"bearer": []}],
    "paths": {
        "/healthz": {"get": {**_op("Liveness; needs no token", "200"), "security": []}},
        "/metrics": {"get": _op("Prometheus metrics (text format)", "200")},
        "/openapi.json": {"get": _op("This document", "200")},
        "/api/v1/backends": {"get": _op("Every backend's status", "200")},
        "/api/v1/backends/{name}": {
            "parameters": [_NAME],
            "get": _op("One backend's status", "200", "404"),
            "put": _op(
                "Deploy (create or update)", "200", "400", "409", "413", "422", body="Backend"
            ),
            "delete": {
                **_op("Drain and delete", "202", "404"),
                "parameters": [{"name": "force", "in": "query", "schema": {"type": "boolean"}}],
            },
        },
        "/api/v1/apply": {
            "post": _op(
                "Deploy every backend of a manifest; prune deletes the others",
                "200",
                "400",
                "409",
                "413",
                "422",
                body="Apply",
            )
        },
        "/api/v1/watch": {
            "get": {
                **_op("Long poll: snapshots newer than `since`", "200", "400"),
                "parameters": [
                    {"name": "since", "in": "query", "schema": {"type": "integer"}},
                    {"name": "epoch", "in": "query", "schema": {"type": "string"}},
                    {"name": "timeout_s", "in": "query", "schema": {"type": "number"}},
                ],
            }
        },
        "/api/v1/shutdown": {"post": _op("Drain and delete everything, then exit", "202")},
    },
}
