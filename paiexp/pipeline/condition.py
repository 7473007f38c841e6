"""``when:`` conditions, a small expression language over earlier steps' results::

    steps.train.metrics["test-accuracy"] <= 0.90
    steps.refit.metrics["test-auc"] >= 0.97 and not steps.search.best.trial == 0

Comparisons (``== != < <= > >=``, chained as in ``0.9 < x <= 1``), ``and``/``or``/``not``,
parentheses, numbers, strings, ``true``/``false``, and references ``steps.NAME.field...``
(each further part as ``.name`` or ``["name"]``).  Python's own parser reads the text; the
tree is then checked against that whitelist and walked here: nothing is run by Python's eval.
"""

from __future__ import annotations

import ast
import json
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from paiexp.errors import UserError

IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
BOOLEANS = {"true": True, "false": False, "True": True, "False": False}
ORDERINGS: dict[type, tuple[str, Callable[[Any, Any], bool]]] = {
    ast.Lt: ("<", operator.lt),
    ast.LtE: ("<=", operator.le),
    ast.Gt: (">", operator.gt),
    ast.GtE: (">=", operator.ge),
}
EQUALITIES: dict[type, tuple[str, Callable[[Any, Any], bool]]] = {
    ast.Eq: ("==", operator.eq),
    ast.NotEq: ("!=", operator.ne),
}
NOT_ALLOWED = {
    ast.Call: "a function call",
    ast.BinOp: "arithmetic",
    ast.Lambda: "a lambda",
    ast.IfExp: "an if-expression",
    ast.List: "a list",
    ast.Tuple: "a tuple",
    ast.Dict: "a mapping",
}
HELP = "use comparisons (== != < <= > >=), and/or/not, numbers, strings, steps.NAME... references"


class ConditionError(Exception):
    """A condition that cannot be evaluated with the results at hand (one line)."""


@dataclass(frozen=True)
class Reference:
    """``steps.STEP.a.b["c"]``: a step and a path into its results."""

    step: str
    path: tuple[str, ...]

    def __str__(self) -> str:
        parts = [f".{p}" if IDENTIFIER.match(p) else f"[{json.dumps(p)}]" for p in self.path]
        return f"steps.{self.step}{''.join(parts)}"


@dataclass(frozen=True)
class Condition:
    text: str
    tree: ast.Expression
    references: tuple[Reference, ...]

    def evaluate(self, results: Mapping[str, Any]) -> tuple[bool, dict[str, Any]]:
        """Its truth over ``results`` (step -> results), and each reference's value it read."""
        seen: dict[str, Any] = {}
        return bool(_evaluate(self.tree.body, results, seen)), seen


def parse_condition(text: str, key: str) -> Condition:
    """The condition ``text`` (the config value at ``key``); a one-line UserError if malformed."""
    source = str(text).strip()
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError as exc:
        where = f" at column {exc.offset}" if exc.offset else ""
        raise UserError(f"{key}: cannot parse {source!r}: {exc.msg}{where}") from None
    references: list[Reference] = []
    _check(tree.body, key, references)
    return Condition(source, tree, tuple(references))


def _check(node: ast.expr, key: str, references: list[Reference]) -> None:
    match node:
        case ast.BoolOp(values=values):
            for value in values:
                _check(value, key, references)
        case ast.UnaryOp(op=ast.Not(), operand=operand):
            _check(operand, key, references)
        case ast.UnaryOp(op=ast.USub() | ast.UAdd(), operand=ast.Constant(value=value)) if (
            _is_number(value)
        ):
            pass
        case ast.Compare(left=left, ops=ops, comparators=comparators):
            for op in ops:
                if type(op) not in ORDERINGS and type(op) not in EQUALITIES:
                    raise UserError(f"{key}: '{ast.unparse(node)}': operator not allowed; {HELP}")
            for operand in (left, *comparators):
                _check(operand, key, references)
        case ast.Constant(value=value) if _is_number(value) or isinstance(value, str | bool):
            pass
        case ast.Name(id=name) if name in BOOLEANS:
            pass
        case ast.Attribute() | ast.Subscript() | ast.Name():
            references.append(_reference(node, key))
        case _:
            what = NOT_ALLOWED.get(type(node), "this syntax")
            raise UserError(f"{key}: '{ast.unparse(node)}' is {what}, not allowed here; {HELP}")


def _reference(node: ast.expr, key: str) -> Reference:
    """``steps.NAME...`` as a Reference; anything else a UserError."""
    path: list[str] = []
    while True:
        match node:
            case ast.Attribute(value=inner, attr=attr):
                path.append(attr)
                node = inner
            case ast.Subscript(value=inner, slice=ast.Constant(value=str() as part)):
                path.append(part)
                node = inner
            case ast.Name(id="steps") if path:
                path.reverse()
                if len(path) < 2:
                    raise UserError(f"{key}: steps.{path[0]}: name one of its results")
                return Reference(path[0], tuple(path[1:]))
            case _:
                raise UserError(
                    f"{key}: '{ast.unparse(node)}' is not a reference; refer to results as "
                    'steps.NAME.metrics["x"], steps.NAME.status, ...'
                )


def _evaluate(node: ast.expr, results: Mapping[str, Any], seen: dict[str, Any]) -> Any:
    match node:
        case ast.BoolOp(op=ast.And(), values=values):
            return all(_evaluate(v, results, seen) for v in values)
        case ast.BoolOp(op=ast.Or(), values=values):
            return any(_evaluate(v, results, seen) for v in values)
        case ast.UnaryOp(op=ast.Not(), operand=operand):
            return not _evaluate(operand, results, seen)
        case ast.UnaryOp(op=ast.USub(), operand=ast.Constant(value=int() | float() as value)):
            return -value
        case ast.UnaryOp(op=ast.UAdd(), operand=ast.Constant(value=value)):
            return value
        case ast.Compare(left=left, ops=ops, comparators=comparators):
            a = _evaluate(left, results, seen)
            for op, right in zip(ops, comparators, strict=True):
                b = _evaluate(right, results, seen)
                if not _compare(a, op, b):
                    return False
                a = b
            return True
        case ast.Constant(value=value):
            return value
        case ast.Name(id=name) if name in BOOLEANS:
            return BOOLEANS[name]
    reference = _reference(node, "when")
    value = lookup(results, reference)
    seen[str(reference)] = value
    return value


def lookup(results: Mapping[str, Any], reference: Reference) -> Any:
    """The value a reference names; a ConditionError listing what there is when it is not."""
    if reference.step not in results:
        raise ConditionError(f"{reference}: step {reference.step} has no results")
    value: Any = results[reference.step]
    where = f"steps.{reference.step}"
    for part in reference.path:
        if not isinstance(value, Mapping):
            raise ConditionError(f"{where} is {value!r}, which has no {part!r}")
        if part not in value:
            has = ", ".join(sorted(map(str, value))) or "nothing"
            raise ConditionError(f"{where} has no {part!r}; it has: {has}")
        value = value[part]
        where = f"{where}[{part!r}]" if not IDENTIFIER.match(part) else f"{where}.{part}"
    return value


def _compare(a: Any, op: ast.cmpop, b: Any) -> bool:
    if type(op) in EQUALITIES:
        return EQUALITIES[type(op)][1](a, b)
    symbol, compare = ORDERINGS[type(op)]
    if not ((_is_number(a) and _is_number(b)) or (isinstance(a, str) and isinstance(b, str))):
        raise ConditionError(f"cannot compare {a!r} {symbol} {b!r}")
    return compare(a, b)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
