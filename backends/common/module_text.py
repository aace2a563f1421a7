"""Text every generated module holds, whichever backend wrote it: the error its driver
raises for a bad input, the message for a token id outside its table, and the signature
tables of kernels compiled eagerly."""

from __future__ import annotations

from collections.abc import Iterable

from irc.backends.common.kernel import NUMBA_TYPES, Kernel
from irc.backends.literals import str_literal

# The error a driver raises for a bad input, and the message for a token id outside an
# embedding table (an f-string of the driver's locals).
INPUT_ERROR = '''

class InputError(ValueError):
    """An input this graph cannot run on (such as a token id outside the table)."""
'''
BAD_TOKEN_ID = 'f"{where}: token id {token} (at flat position {position}) is outside its vocabulary [0, {vocab})"'

# The generated module's preamble for SIGNATURES: the argument-type names and a helper.
TYPES = """
# Kernel argument types for numba: arrays are C-contiguous (::1) with a fixed rank.
"""

SIGNATURE_FN = '''

def signature(*args, returns="void"):
    return f"{returns}({', '.join(args)})"


'''


def signature_tables(kernels: Iterable[Kernel], note: str) -> list[str]:
    """The argument-type names, ``signature()``, and SIGNATURES (``note`` comments it): the
    same in every generated module that compiles its kernels eagerly."""
    out = [TYPES]
    out += [f"{name} = {str_literal(spelling)}\n" for name, spelling in NUMBA_TYPES.items()]
    out.append(SIGNATURE_FN)
    out.append(f"SIGNATURES = (  # {note}\n")
    out += [f"    ({str_literal(k.name)}, {k.signature_code}),\n" for k in kernels]
    out.append(")\n")
    return out
