"""Numbers a mapping table takes from the model's config, never from tensor shapes.

A table's ``params:`` section names them, each as an expression over ``config.json``
keys and earlier params, or a list of alternatives (the first whose keys are all set)::

    params:
      heads: num_attention_heads
      kv_heads: [num_key_value_heads, num_attention_heads]   # MHA configs leave it out
      head_dim: [head_dim, hidden_size / num_attention_heads]
      q_per_kv: heads / kv_heads

An alternative may hold only where a config switch is true: ``{if: KEY, then: EXPR}``
(``kv_groups: [{if: multi_query_attention, then: multi_query_group_num},
num_attention_heads]``: the group count a config may carry with its switch off is not
read).

Expressions are parsed with :mod:`ast` and evaluated by hand: integers, names, ``+ - *``
and exact ``/`` (``//`` rounds down). Nothing is ever ``eval``-ed; a division that
leaves a remainder, a missing key or a non-integer value is an error naming the key.
"""

from __future__ import annotations

import ast
from typing import Any

#: the longest expression accepted (a table is data, not a program)
MAX_EXPR = 200


class ParamError(ValueError):
    """A param cannot be computed from the config; the message names what is missing."""


def check_expression(expr: Any) -> ast.expr:
    """Parse one expression, refusing anything but integers, names and + - * / //."""
    if not isinstance(expr, (str, int)) or isinstance(expr, bool):
        raise ParamError(f"{expr!r} is not an expression (a config key, a number, or "
                         "arithmetic with + - * / //)")
    text = str(expr)
    if len(text) > MAX_EXPR:
        raise ParamError(f"expression of {len(text)} characters is too long (at most "
                         f"{MAX_EXPR})")
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError:
        raise ParamError(f"{text!r} is not an expression (a config key, a number, or "
                         "arithmetic with + - * / //)") from None
    for node in ast.walk(tree):
        if not isinstance(node, (ast.BinOp, ast.Name, ast.Constant, ast.Load, ast.Add,
                                 ast.Sub, ast.Mult, ast.Div, ast.FloorDiv)):
            raise ParamError(f"{text!r}: only config keys, integers and + - * / // are "
                             f"allowed, not {type(node).__name__}")
        if isinstance(node, ast.Constant) and (not isinstance(node.value, int)
                                               or isinstance(node.value, bool)):
            raise ParamError(f"{text!r}: {node.value!r} is not an integer")
    return tree


#: the largest magnitude a param may take: a tensor dimension, never more
MAX_VALUE = 2**40


def _bounded(value: int, text: str) -> int:
    if abs(value) > MAX_VALUE:
        raise ParamError(f"{text!r} reaches a value beyond 2**40, more than any tensor "
                         "dimension; check the expression and the config")
    return value


def check_alternative(alternative: Any) -> None:
    """An expression, or ``{if: KEY, then: EXPRESSION}`` (raises ParamError)."""
    if isinstance(alternative, dict):
        if set(alternative) != {"if", "then"} or not (
                isinstance(alternative["if"], str) and alternative["if"].isidentifier()
                and len(alternative["if"]) <= MAX_EXPR):
            raise ParamError(f"{repr(alternative)[:MAX_EXPR]}: a guarded alternative is "
                             "{if: CONFIG_KEY, then: EXPRESSION}")
        check_expression(alternative["then"])
        return
    check_expression(alternative)


def names_in(expr: Any) -> set[str]:
    return {n.id for n in ast.walk(check_expression(expr)) if isinstance(n, ast.Name)}


def evaluate(expr: Any, values: dict[str, Any]) -> int:
    """The integer value of ``expr`` with ``values`` (config keys and params)."""
    return _eval(check_expression(expr), values, str(expr))


def _eval(node: ast.expr, values: dict[str, Any], text: str) -> int:
    if isinstance(node, ast.Constant):
        return int(node.value)
    if isinstance(node, ast.Name):
        value = values.get(node.id)
        if isinstance(value, int) and not isinstance(value, bool):
            return _bounded(value, text)
        if value is None:
            raise ParamError(f"{text!r} needs {node.id!r}, which the config does not set")
        if not isinstance(value, int) or isinstance(value, bool):
            raise ParamError(f"{text!r}: config {node.id!r} is {value!r}, not an integer")
        return value
    assert isinstance(node, ast.BinOp)
    left, right = _eval(node.left, values, text), _eval(node.right, values, text)
    if isinstance(node.op, ast.Add):
        return _bounded(left + right, text)
    if isinstance(node.op, ast.Sub):
        return _bounded(left - right, text)
    if isinstance(node.op, ast.Mult):
        return _bounded(left * right, text)
    if right == 0:
        raise ParamError(f"{text!r} divides by zero")
    if isinstance(node.op, ast.Div) and left % right:
        raise ParamError(f"{text!r}: {left} / {right} is not a whole number; the config's "
                         "sizes do not divide evenly")
    return left // right


def resolve(params: dict[str, list[Any]], config: dict[str, Any]) -> dict[str, tuple[int, str]]:
    """Every param's value and where it came from (``num_key_value_heads``).

    Raises:
        ParamError: naming the param and the config keys none of its alternatives found.
    """
    values: dict[str, Any] = {k: v for k, v in config.items() if not isinstance(v, dict)}
    out: dict[str, tuple[int, str]] = {}
    for name, alternatives in params.items():
        errors = []
        for expr in alternatives:
            how = str(expr)
            if isinstance(expr, dict):  # {if: KEY, then: EXPR}: only where KEY is true
                switch = values.get(expr["if"])
                if switch is not True:
                    errors.append(f"{expr['if']!r} is {repr(switch)[:40]}, not true")
                    continue
                expr, how = expr["then"], f"{expr['then']}, {expr['if']} true"
            try:
                value = evaluate(expr, {**values, **{k: v for k, (v, _) in out.items()}})
            except ParamError as exc:
                errors.append(str(exc))
                continue
            out[name] = (value, how)
            break
        else:
            raise ParamError(f"param {name!r}: " + "; ".join(errors))
    return out


__all__ = ["ParamError", "check_alternative", "check_expression", "evaluate", "names_in",
           "resolve"]
