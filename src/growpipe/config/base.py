"""The base of every config model: unknown fields, inf and nan refused; fields documented by docstrings."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    # allow_inf_nan=False: every float field refuses inf and nan (a learning rate of inf would validate and
    # then train to NaN), each refusal one line naming the field (problem_lines)
    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True,
                              allow_inf_nan=False)  # fmt: skip
