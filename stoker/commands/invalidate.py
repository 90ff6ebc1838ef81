"""`stoker invalidate ...`: publish invalidation events for the invalidation worker to apply."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from pydantic import ValidationError

from schemas.events import BaseEvent, Invalidate, KnowledgeBaseChanged, PromptTemplateChanged
from stoker.app import Typer, app, console, examples
from stoker.connect import KafkaBootstrap, connected

invalidate_app = Typer(
    help="Publish invalidations to Kafka (the invalidation worker applies them).",
    short_help="Publish invalidations (by doc, context, namespace, template).",
    epilog=examples(
        "stoker invalidate doc kb/refunds --tenant acme",
        "stoker invalidate kb kb/refunds --tenant acme --doc-version 4 \\",
        "    --text-file refunds.md",
    ),
    no_args_is_help=True,
)
app.add_typer(invalidate_app, name="invalidate")

Tenant = Annotated[str, typer.Option("--tenant", help="tenant id")]
Model = Annotated[str | None, typer.Option("--model", help="narrow to this model id")]
Version = Annotated[str | None, typer.Option("--version", help="narrow to this model version")]
Template = Annotated[str | None, typer.Option("--template", help="narrow to this template")]
Reason = Annotated[str, typer.Option(help="why, for the audit trail")]


def _send(
    logical: str, build: Callable[..., BaseEvent], key: str, kafka: str | None, **fields: Any
) -> None:
    try:
        ev = build(**fields)
    except ValidationError as e:  # bad usage: exit 2 with pydantic's own words
        raise typer.BadParameter(str(e)) from None
    from stoker.stack import Stack  # here: importing the wiring costs ~1 s

    with Stack(connected(console, kafka_bootstrap=kafka)) as stack:
        stack.publisher.publish(logical, ev, key=key)
        stack.publisher.flush()
    console.print(f"published {type(ev).__name__} {ev.event_id} to {logical}")


def _invalidate(
    by: Literal["context_hash", "doc", "entity", "namespace"],
    tenant: str,
    value: str,
    model: str | None,
    version: str | None,
    template: str | None,
    reason: str,
    kafka: str | None,
) -> None:
    _send(
        "inference.invalidations",
        Invalidate,
        f"{tenant}/{value}",
        kafka,
        tenant=tenant,
        by=by,
        value=value,
        model_id=model,
        model_version=version,
        template_version=template,
        reason=reason,
    )


@invalidate_app.command(
    short_help="Delete every entry built on a document.",
    epilog=examples('stoker invalidate doc kb/refunds --tenant acme --reason "new policy"'),
)
def doc(
    doc_id: Annotated[str, typer.Argument(help="document id")],
    tenant: Tenant,
    model: Model = None,
    version: Version = None,
    template: Template = None,
    reason: Reason = "",
    kafka_bootstrap: KafkaBootstrap = None,
) -> None:
    """Delete every entry built on DOC_ID, whatever its version."""
    _invalidate("doc", tenant, doc_id, model, version, template, reason, kafka_bootstrap)


@invalidate_app.command(
    short_help="Delete every entry computed from a context.",
    epilog=examples("stoker invalidate context 9b1d4c0e7a2f5d31 --tenant acme"),
)
def context(
    context_hash: Annotated[str, typer.Argument(help="context hash (caches.keys.context_hash)")],
    tenant: Tenant,
    model: Model = None,
    version: Version = None,
    template: Template = None,
    reason: Reason = "",
    kafka_bootstrap: KafkaBootstrap = None,
) -> None:
    """Delete every entry computed from this context."""
    _invalidate(
        "context_hash", tenant, context_hash, model, version, template, reason, kafka_bootstrap
    )


@invalidate_app.command(
    short_help="Flush a tenant's model namespace.",
    epilog=examples("stoker invalidate namespace --tenant acme --model llama-3-8b --version v7"),
)
def namespace(
    tenant: Tenant,
    model: Annotated[str, typer.Option("--model", help="model id")],
    version: Version = None,
    template: Template = None,
    reason: Reason = "",
    kafka_bootstrap: KafkaBootstrap = None,
) -> None:
    """Flush a tenant's model namespace (narrowed by version / template): bump, then purge."""
    _invalidate("namespace", tenant, "", model, version, template, reason, kafka_bootstrap)


@invalidate_app.command(
    short_help="Publish a document's change (re-warmed with its new text).",
    epilog=examples(
        "stoker invalidate kb kb/refunds --tenant acme --doc-version 4 \\",
        "    --text-file refunds.md --previous-text-file refunds-v3.md",
        "stoker invalidate kb kb/old --tenant acme --doc-version 9 --change deleted",
    ),
)
def kb(
    doc_id: Annotated[str, typer.Argument(help="document id")],
    tenant: Tenant,
    doc_version: Annotated[int, typer.Option("--doc-version", min=0, help="its new version")],
    change: Annotated[str, typer.Option(help="updated | retracted | deleted")] = "updated",
    text_file: Annotated[
        Path | None,
        typer.Option(
            help="the document's new text (UTF-8): the hot requests that inlined the "
            "old text are re-warmed with it (`stoker worker rewarm`)"
        ),
    ] = None,
    previous_text_file: Annotated[
        Path | None,
        typer.Option(help="its text before the change, as the logged requests inline it"),
    ] = None,
    kafka_bootstrap: KafkaBootstrap = None,
) -> None:
    """Publish a KnowledgeBaseChanged: entries built on older versions of DOC_ID go."""
    texts = {"text": _read_text(text_file, "--text-file"),
             "previous_text": _read_text(previous_text_file, "--previous-text-file")}  # fmt: skip
    given = {k: v for k, v in texts.items() if v is not None}
    _send(
        "inference.kb-changes",
        KnowledgeBaseChanged,
        f"{tenant}/{doc_id}",  # one key per doc: a doc's changes stay in order on one partition
        kafka_bootstrap,
        tenant=tenant,
        doc_id=doc_id,
        doc_version=doc_version,
        change=change,
        **({"schema_version": 2, **given} if given else {}),
    )


def _read_text(path: Path | None, param: str) -> str | None:
    if path is None:
        return None
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise typer.BadParameter(f"cannot read {path}: {e}", param_hint=param) from None


@invalidate_app.command(
    short_help="Retire a prompt template's namespace.",
    epilog=examples(
        "stoker invalidate template --tenant acme --model llama-3-8b \\",
        "    --old t3 --new t4",
    ),
)
def template(
    tenant: Tenant,
    model: Annotated[str, typer.Option("--model", help="model id")],
    old: Annotated[str, typer.Option("--old", help="template version to retire")],
    new: Annotated[str, typer.Option("--new", help="template version now live")],
    kafka_bootstrap: KafkaBootstrap = None,
) -> None:
    """Publish a PromptTemplateChanged: the old template's namespace is retired and purged."""
    _send(
        "inference.kb-changes",
        PromptTemplateChanged,
        f"{tenant}/{model}",
        kafka_bootstrap,
        tenant=tenant,
        model_id=model,
        old_template_version=old,
        new_template_version=new,
    )
