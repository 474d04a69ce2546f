# SPDX-License-Identifier: Apache-2.0
"""How ``LoaderDataset`` matches a WebDataset's components: as the
``webdataset`` library does by default, or by DALI's rule when asked.

``webdataset`` (1.0.2, ``tariterators.group_by_keys``) splits a member's
name at the first dot after its last slash (``base_plus_ext``: key, then
extension) and lower-cases the extension (``lcase=True``);
``to_tuple("jpg;png", "cls")`` then looks each alternative up as given.
So ``n01440764_10026.JPEG`` is component ``jpeg``, and an alternative
with an upper-case letter matches nothing. The daemon's
``case_sensitive_extensions=False`` (DALI's) lower-cases both sides:
over the lower-case alternatives it is ``webdataset``'s rule, so those
are what is sent, and an entry with none left is refused here, naming
the extension ``webdataset`` sees."""

from __future__ import annotations

from typing import Any, Optional

from ._args import ext_arg


def webdataset_ext(ext: object) -> tuple[str, ...]:
    """``ext`` as ``webdataset``'s ``to_tuple`` matches it against
    lower-cased extensions: each entry's alternatives with an upper-case
    letter left out (they match no member there).

    Raises
    ------
    ValueError
        ``ext`` is not valid (``_args.ext_arg``), or an entry has only
        upper-case alternatives: it would match no member.
    """
    out = []
    for e in ext_arg(ext):
        alts = [a for a in e.split(";") if a == a.lower()]
        if not alts:
            raise ValueError(f"ext entry {e!r} matches no member as webdataset matches them: it lower-cases each "
                             f"member's extension (n01440764_10026.JPEG has 'jpeg'), so write {e.lower()!r}; or "
                             "pass case_sensitive_extensions=True (or False) for DALI's rule")
        out.append(";".join(alts))
    return tuple(out)


def ext_args(ext: Optional[Any], case_sensitive_extensions: Optional[bool]) -> dict[str, Any]:
    """``LoaderSource``'s ``ext`` and ``case_sensitive_extensions`` for a
    ``LoaderDataset``'s: ``None`` (its default) is ``webdataset``'s rule
    (``webdataset_ext``, matched case-insensitively by the daemon),
    ``True`` or ``False`` DALI's, ``ext`` as given.

    Raises
    ------
    ValueError
        As ``webdataset_ext``.
    """
    if case_sensitive_extensions is not None or ext is None:
        case = True if case_sensitive_extensions is None else case_sensitive_extensions
        return {"ext": ext, "case_sensitive_extensions": case}
    return {"ext": list(webdataset_ext(ext)), "case_sensitive_extensions": False}
