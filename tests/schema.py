"""Tool calls checked against the tool's wire schema (``Tool.schema()``) by jsonschema,
a validator the project did not write: model/tools.py's ``validate`` is the code under
test, so it cannot be the judge of the calls the model decodes too."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jsonschema

from model.tools import Tool


def assert_fits_schema(tool: Tool, arguments: Mapping[str, Any]) -> None:
    """``arguments`` are an instance of ``tool``'s parameters schema, which is itself a
    valid JSON Schema (draft 2020-12). The wire schema leaves ``additionalProperties``
    unsaid, as OpenAI's tools do; a call still names only declared parameters."""
    parameters = tool.schema()["parameters"]
    jsonschema.Draft202012Validator.check_schema(parameters)
    closed = {**parameters, "additionalProperties": False}
    jsonschema.Draft202012Validator(closed).validate(dict(arguments))
