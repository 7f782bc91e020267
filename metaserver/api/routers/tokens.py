"""``/api/v1/tokens``: client tokens, created, listed and revoked by the administrator.

A token stands for an identity (uid, gid, supplementary groups) that the
metaserver's permission checks use; see :mod:`emberfs.metaserver.tokens`.
Every route needs the admin token, listing too. The token string is in the
answer to its creation only: the store keeps a digest of its secret.
"""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, status

from emberfs.metaserver.api.deps import AdminDep, TokensDep
from emberfs.metaserver.api.schemas import (
    ERROR_RESPONSES,
    STEERING_RESPONSES,
    TokenCreatedPublic,
    TokenIn,
    TokenListPublic,
    TokenPublic,
)
from emberfs.metaserver.tokens import AmbiguousName, NameTaken, TokenInfo

router = APIRouter(
    prefix="/api/v1/tokens",
    tags=["tokens"],
    responses={**ERROR_RESPONSES, **STEERING_RESPONSES},
)


def _public(info: TokenInfo) -> TokenPublic:
    return TokenPublic(
        id=info.token_id,
        name=info.name,
        uid=info.uid,
        gid=info.gid,
        groups=list(info.groups),
        created=info.created_ns,
    )


@router.post("", response_model=TokenCreatedPublic, status_code=status.HTTP_201_CREATED)
def create_token(_: AdminDep, tokens: TokensDep, body: TokenIn) -> TokenCreatedPublic:
    """Create a token for an identity; the answer holds the token string, shown only here."""
    try:
        info, token = tokens.create(body.uid, body.gid, body.groups, body.name)
    except NameTaken as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from None
    except ValueError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from None
    return TokenCreatedPublic(**_public(info).model_dump(), token=token)


@router.get("", response_model=TokenListPublic)
def list_tokens(_: AdminDep, tokens: TokensDep) -> TokenListPublic:
    """Every live token, oldest first (never their secrets)."""
    return TokenListPublic(tokens=[_public(info) for info in tokens.list()])


@router.delete("/{which:path}", response_model=TokenPublic)
def revoke_token(_: AdminDep, tokens: TokensDep, which: str) -> TokenPublic:
    """Revoke the token with this id or name; the revoked token.

    The metaserver refuses the token within ~2 s (its lookups are cached that long), storage
    servers once the chunk capabilities handed out under it expire.
    """
    try:
        return _public(tokens.revoke(which))
    except KeyError as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, exc.args[0]) from None
    except AmbiguousName as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from None
