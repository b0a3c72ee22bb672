"""`drafter_checkpoint`: EAGLE-3 training through the trainer resource, exported per engine."""

# No `from __future__ import annotations`: Dagster resolves Config types from real annotations.

import hashlib
import json
import shutil
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Literal, Optional

import dagster as dg

from eagle_assets.checked_reads import read_json_object
from eagle_assets.defs.code_versions import REPORTING_SETTINGS, code_version
from eagle_assets.defs.common import GROUP, check_result, hash_files, hash_tree, metadata, target_of
from eagle_assets.defs.corpus import synthetic_corpus
from eagle_assets.defs.hidden_state_settings import NUM_SHARDS, engine_max_model_len, training_source
from eagle_assets.defs.hidden_states import hidden_state_shards, vocab_mapping
from eagle_assets.defs.sensors import after_its_asset
from eagle_assets.defs.settings import with_defaults
from eagle_assets.drafter.config import folder_drafts_in_parallel, folder_num_layers, vllm_only_reason
from eagle_assets.drafter.export import check_sglang_names, read_drafter_tensors
from eagle_assets.drafter.parent_gate import AL_ROUNDING
from eagle_assets.drafter.run_config import HIDDEN_STATE_SOURCES, Parallelism, Precision, Tracker, TrainConfig, defaults
from eagle_assets.drafter.sources import online_aux_layer_ids
from eagle_assets.drafter.train import SUMMARY_FILE
from eagle_assets.durable import write_durably
from eagle_assets.engines.serving import SMOKE_PROMPTS, chat_once, cold_sampling_check
from eagle_assets.formats import CORPUS_MANIFEST, SHARD_MANIFEST_FILE
from eagle_assets.hidden_states.reader import stored_aux_layer_ids
from eagle_assets.resources.inference_server import NEEDS_DRAFTER_SERVER, InferenceServerResource
from eagle_assets.resources.storage import StorageResource
from eagle_assets.resources.trainer import TrainerResource
from eagle_assets.targets.hub import drafter_folder

DRAFTER_KEY = dg.AssetKey("drafter_checkpoint")

_TRAINER = defaults(TrainConfig)
"""The trainer's defaults: the one place a training default is written. The fields below that
the trainer also has take their defaults from here, and reach it under the same name."""


class DrafterAssetConfig(dg.Config):
    ttt_steps: Optional[int] = None
    """Training-time-test unroll K; default: the target preset's."""
    drafter_num_layers: int = _TRAINER["drafter_num_layers"]
    """Decoder layers of the drafter. More than one serves in vLLM only (SGLang's later layers
    compute another function), so the SGLang export is then left out."""
    drafter_intermediate_size: Optional[int] = _TRAINER["drafter_intermediate_size"]
    """MLP width of the drafter; default: the target's. Wider accepts a little more but makes
    every draft step dearer: where the target is small next to the drafter (SmolLM2 on CPU), the
    target's width serves faster."""
    epochs: int = _TRAINER["epochs"]
    max_steps: Optional[int] = _TRAINER["max_steps"]
    lr: float = _TRAINER["lr"]
    warmup_steps: int = _TRAINER["warmup_steps"]
    micro_batch_tokens: int = _TRAINER["micro_batch_tokens"]
    grad_accum: int = _TRAINER["grad_accum"]
    val_fraction: float = _TRAINER["val_fraction"]
    val_interval: int = _TRAINER["val_interval"]
    checkpoint_every: int = _TRAINER["checkpoint_every"]
    parallelism: Parallelism = _TRAINER["parallelism"]
    """"ddp" or "fsdp2"."""
    aux_layer_ids: Optional[list[int]] = None
    """Train on these of the extracted aux layers (a subset of hidden_state_shards'
    aux_layer_ids, ascending); default: all of them. Extract once at more layers, then compare
    layer choices by training only. A drafter that reads the last layer (id L) is exported for
    vLLM only: SGLang cannot capture that layer."""
    warm_start: Optional[str] = _TRAINER["warm_start"]
    """A parent drafter to fine-tune from (`midlayer.*` or `layers.0.*` names): its folder, or a
    hub id pulled with `eagle-assets target pull ORG/NAME`."""
    parent_numbering: str = _TRAINER["parent_numbering"]
    """How the parent counts its layer ids where its config does not say: "measure" (its
    held-out acceptance at both readings, the better trained and recorded), "vllm" or "sglang"."""
    ptd_token_id: Optional[int] = _TRAINER["ptd_token_id"]
    """Set: train the drafter for vLLM's parallel drafting (P-EAGLE): draft steps after the first
    are mask slots that read this token's embedding and a learned state, all drafted in one
    forward. vLLM only. A round then costs less than a step-by-step one, but the drafts after
    the first accept less, and on SmolLM2 it served level with a chain drafter at best. None:
    step by step (EAGLE-3)."""
    seed: int = _TRAINER["seed"]
    min_finetune_samples: int = _TRAINER["min_finetune_samples"]
    """A warm start with fewer training samples than this ships its parent unchanged, measured on
    the whole corpus (so few samples cannot move a parent, nor tell a fine-tune from it)."""
    precision: Precision = _TRAINER["precision"]
    """"auto" (bf16 autocast on a GPU, fp32 on a CPU, where bf16 kernels differ by processor
    kind), "fp32" or "bf16". Recorded in summary.json and the model card."""
    hidden_states: Literal[("auto", *HIDDEN_STATE_SOURCES)] = "auto"
    """Where training takes the target's states from. "shards": hidden_state_shards, extracted
    once and read every epoch. Online, never on disk (hidden_state_shards is then not built):
    "target", the target loaded in the trainer beside the drafter, its forward in each step;
    "server", an extraction server (EAGLE_ASSETS_EXTRACTION_URL, or a vLLM launched for the
    run) asked a few steps ahead. "auto": shards where they pay (two epochs or more) and fit
    the disk, else online: the target where Hugging Face would extract it, else the server."""
    tracker: Tracker = _TRAINER["tracker"]
    """Where the training's scalars also go, and the benchmark's figures after them:
    "tensorboard" (data/<target>/drafter/tensorboard), "mlflow", "wandb" (optional extras:
    pip install -e '.[mlflow]' / '.[wandb]') or "none". Changes nothing the drafter is: a new
    tracker makes nothing stale."""
    tracker_project: Optional[str] = _TRAINER["tracker_project"]
    """The MLflow experiment or W&B project; default "eagle_assets"."""
    tracker_uri: Optional[str] = _TRAINER["tracker_uri"]
    """MLflow's tracking server, e.g. http://mlflow.internal:5000; default MLFLOW_TRACKING_URI."""


PASSED_TO_TRAINER = tuple(
    name for name in DrafterAssetConfig.model_fields if name in _TRAINER and name not in ("ttt_steps", "aux_layer_ids", "hidden_states", "warm_start")
)
"""The settings handed to the trainer as they are (ttt_steps and aux_layer_ids get the
preset's and the shards' values where unset; hidden_states is resolved first; warm_start is
resolved to a folder)."""
HIDDEN_STATES_TAG = "eagle_assets/hidden_states"
"""Tag on drafter runs `eagle-assets run` submits: "shards", "target" or "server"."""


DrafterSettings = with_defaults(DrafterAssetConfig, "drafter_checkpoint")
"""DrafterAssetConfig with the code location's settings as defaults (defs/settings.py)."""


TRAINING_KEY_FILE = "training.key.json"
_NOT_IN_TRAINING_KEY = frozenset({"extraction_url", "extraction_model", "extraction_api_key_env", "tensorboard_dir"}) | REPORTING_SETTINGS


def training_key(config: TrainConfig) -> str:
    """A hash of what a training computes from: its settings and the content of its inputs (the
    shards' manifests, which carry their states files' SHA-256, and the vocabulary file)."""
    inputs = [p for folder in config.shard_dirs for p in sorted(Path(folder).glob(f"*/{SHARD_MANIFEST_FILE}"))]
    if config.corpus_dir:  # online training reads the corpus itself
        inputs += [p for p in [Path(config.corpus_dir) / CORPUS_MANIFEST] if p.is_file()]
    # Where the states are served from and where the scalars go change nothing a step computes.
    settings = {k: v for k, v in config.to_dict().items() if k not in _NOT_IN_TRAINING_KEY}
    parts = {"config": settings, "inputs": hash_files([*inputs, Path(config.vocab_mapping)])}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def clear_other_trainings(config: TrainConfig, log) -> None:
    """Leave in the checkpoint folder only checkpoints of this training. The trainer resumes from
    the newest checkpoint there: right in a rerun after a failure, wrong once the inputs or the
    settings changed (new prompts, a new vocabulary), where it would refuse the checkpoint or
    finish the old training. So another training's checkpoints (another key in
    TRAINING_KEY_FILE) are removed, and this training's key is written beside them."""
    key, key_file, checkpoints = training_key(config), Path(config.out_dir) / TRAINING_KEY_FILE, config.checkpoint_dir
    try:
        kept = json.loads(key_file.read_text()).get("key")
    except (OSError, ValueError, AttributeError):
        kept = None
    if kept != key and checkpoints.is_dir() and any(checkpoints.iterdir()):
        log(f"the checkpoints in {checkpoints} are another training's (its inputs or settings changed): training starts afresh")
        shutil.rmtree(checkpoints)
    key_file.parent.mkdir(parents=True, exist_ok=True)
    write_durably(key_file, json.dumps({"key": key}).encode())


@dg.asset(
    group_name=GROUP,
    deps=[vocab_mapping, hidden_state_shards, synthetic_corpus],
    code_version=code_version("drafter_checkpoint", DrafterSettings),
)
def drafter_checkpoint(
    context: dg.AssetExecutionContext,
    config: DrafterSettings,
    inference_server: InferenceServerResource,
    storage: StorageResource,
    trainer: TrainerResource,
):
    """An EAGLE-3 drafter trained on the target's hidden states with the engines' exact draft
    function (training-time test over K steps, loss against the target's distribution on the
    draft vocabulary), launched with torchrun through Dagster Pipes, exported for vLLM and
    SGLang and smoke-loaded in the real vLLM server. The states come from the shards, or online
    (`hidden_states`): from the target in the trainer or an extraction server, never on disk."""
    preset, path = target_of(inference_server)
    out = storage.drafter(preset.name)
    # With a URL root: the corpus, the vocabulary and the earlier checkpoints (training resumes from the newest).
    storage.fetch(storage.corpus(preset.name), storage.vocab_mapping(preset.name), out, log=context.log.info)
    source = training_source(config.hidden_states, config.epochs, preset, path, storage)
    context.log.info(f"hidden states: {source}" + ("" if source == "shards" else " (online: hidden_state_shards is not read)"))
    if source == "shards":
        storage.fetch(storage.hidden_states(preset.name), log=context.log.info)
    parent = str(drafter_folder(config.warm_start)) if config.warm_start else None
    # A warm start keeps its parent's layers; SGLang serves one-layer step-by-step drafters only.
    num_layers = folder_num_layers(parent) if parent else config.drafter_num_layers
    parallel = folder_drafts_in_parallel(parent) if parent else config.ptd_token_id is not None
    if config.aux_layer_ids or source != "shards":
        aux_layer_ids = online_aux_layer_ids(config.aux_layer_ids, parent, preset.num_layers)
    else:
        aux_layer_ids = stored_aux_layer_ids(storage.hidden_states(preset.name))
    # The graph is one run: a server the steps before kept warm would hold the memory (a GPU's)
    # that training needs for minutes to hours, to save a start-up of seconds. The one exception
    # is the extraction server training streams from, which the benchmark reference left warm.
    inference_server.stop_warm(keep_extraction=_extraction_ids(aux_layer_ids, preset) if source == "server" else None)
    vllm_only = vllm_only_reason(num_layers, aux_layer_ids, preset.num_layers, parallel)
    train_config = TrainConfig(
        shard_dirs=(str(storage.hidden_states(preset.name)),) if source == "shards" else (),
        vocab_mapping=str(storage.vocab_mapping(preset.name)),
        target=str(path),
        out_dir=str(out),
        hidden_states=source,
        corpus_dir=str(storage.corpus(preset.name)),
        num_shards=NUM_SHARDS,
        ttt_steps=config.ttt_steps or preset.ttt_steps,
        aux_layer_ids=tuple(aux_layer_ids) if config.aux_layer_ids or source != "shards" else None,
        warm_start=parent,
        drafter_shape=dict(preset.drafter_shape) if not parent and preset.drafter_shape else None,
        **{name: getattr(config, name) for name in PASSED_TO_TRAINER},
        tensorboard_dir=str(out / "tensorboard"),
        export_engines=("vllm",) if vllm_only else ("vllm", "sglang"),
    )
    clear_other_trainings(train_config, context.log.info)
    try:
        with _extraction_server(source, inference_server, preset, aux_layer_ids, storage, context.log.info) as server:
            if server is not None:
                train_config = train_config.replace(
                    extraction_url=server.base_url, extraction_model=server.model, extraction_api_key_env=inference_server.api_key_env
                )
            summary = trainer.train(context, train_config)
    finally:  # a failed run's checkpoints too: a rerun elsewhere resumes from them
        storage.publish(out, log=context.log.info)
    vllm_dir = Path(summary["exports"]["vllm"])
    sglang_dir = Path(summary["exports"]["sglang"]) if "sglang" in summary["exports"] else None
    return dg.MaterializeResult(
        metadata=metadata(
            {
                "steps": summary["steps"],
                "final_loss": summary.get("final_loss"),
                "val_loss": summary.get("val_loss"),
                "val_al": summary.get("val_al"),
                "val_accept_per_position": summary.get("val_accept"),
                "aux_layer_ids": summary.get("aux_layer_ids"),
                "vllm_export": str(vllm_dir),
                "sglang_export": str(sglang_dir) if sglang_dir else vllm_only,
                "seconds": summary.get("seconds"),
                "warm_start": config.warm_start,
                "hidden_states": summary.get("hidden_states", source),
                "hidden_states_origin": summary.get("hidden_states_origin"),
            }
        ),
        data_version=dg.DataVersion(hash_tree(vllm_dir)),
    )


def _extraction_ids(aux_layer_ids, preset) -> list[int]:
    """The layers an extraction server captures for online training: the aux ids and L."""
    return sorted(set(aux_layer_ids) | {preset.num_layers})


@contextmanager
def _extraction_server(source: str, inference_server: InferenceServerResource, preset, aux_layer_ids, storage: StorageResource, log):
    """For "server": the extraction server training streams from, for as long as it trains
    (`extraction_url`, or a vLLM launched for it); else None."""
    if source != "server":
        with nullcontext(None) as none:
            yield none
        return
    ids = _extraction_ids(aux_layer_ids, preset)
    with inference_server.extraction_server(ids, engine_max_model_len(preset, str(storage.corpus(preset.name))), log=log) as server:
        yield server


# The checks read what the asset left (the trainer's summary.json and the exports), so each can
# run again on its own, from the UI's asset page or `eagle-assets check`, without retraining: a
# drafter that failed to serve because of a server that died, or an engine fixed since, is
# checked again in a minute. In the asset's own run they run after it and, being blocking, stop
# the benchmark when they fail.


def _trained(inference_server: InferenceServerResource, storage: StorageResource):
    """(target preset, drafter folder, the trainer's summary) of the materialised drafter."""
    preset, _ = target_of(inference_server)
    out = storage.drafter(preset.name)
    storage.fetch(out / "drafter-vllm", out / "drafter-sglang", out / SUMMARY_FILE)  # not the checkpoints
    if not (out / SUMMARY_FILE).is_file():
        raise ValueError(f"no trained drafter of {preset.name} to check ({out / SUMMARY_FILE} is missing): materialise drafter_checkpoint first")
    summary = read_json_object(out / SUMMARY_FILE, "the trainer's summary of the drafter", "materialise drafter_checkpoint again")
    return preset, out, summary


def drafter_checks(automation: bool = False) -> list:
    """The drafter's checks, definitions of their own beside the asset (not its step). With
    `automation`, each runs once the automation rebuilds the drafter (`after_its_asset`); without
    it they carry no condition, since any condition on a check makes Dagster add an automation
    sensor of its own, and automation off must mean off."""
    condition = after_its_asset() if automation else None

    @dg.multi_asset_check(
        specs=[
            dg.AssetCheckSpec(
                "serves_in_vllm",
                asset="drafter_checkpoint",
                blocking=True,
                automation_condition=condition,
                description="The vLLM export loads in the real vLLM server and its greedy output equals the run without speculation.",
            ),
            dg.AssetCheckSpec(
                "samples_under_speculation",
                asset="drafter_checkpoint",
                automation_condition=condition,
                description="Requests sampled at temperature 1e-4 with the drafter write the greedy answer: the engine gives every draft position the request's sampling settings. A fault of the engine, not the drafter: it warns and does not block.",
            ),
        ],
    )
    def drafter_serves(context: dg.AssetCheckExecutionContext, inference_server: InferenceServerResource, storage: StorageResource):
        """The vLLM export served at its training K beside the target alone: the same greedy answers.
        Both servers stay warm for the benchmark of the same run (two on a CPU host; on a GPU the
        plain one, started second, for the benchmark's baseline)."""
        _, out, summary = _trained(inference_server, storage)
        if inference_server.connected and not (inference_server.url and inference_server.speculative_url):
            # Connected to a server of the user's, which cannot load this drafter: said, not failed,
            # so the graph finishes; the message says how to serve it and check again.
            context.log.warning(NEEDS_DRAFTER_SERVER)
            for name in ("serves_in_vllm", "samples_under_speculation"):
                yield check_result(
                    False, {"not_checked": NEEDS_DRAFTER_SERVER}, blocking_severity=dg.AssetCheckSeverity.WARN, check_name=name, asset_key=DRAFTER_KEY
                )
            return
        with inference_server.serve(drafter=out / "drafter-vllm", k=summary["ttt_steps"], log=context.log.info) as spec:
            got = [chat_once(spec, p) for p in SMOKE_PROMPTS]
            samples_ok, sampling = cold_sampling_check(spec, SMOKE_PROMPTS, got)
        with inference_server.serve(log=context.log.info) as plain:
            expected = [chat_once(plain, p) for p in SMOKE_PROMPTS]
        yield check_result(
            got == expected, {"prompts": SMOKE_PROMPTS, "plain": expected, "speculative": got}, check_name="serves_in_vllm", asset_key=DRAFTER_KEY
        )
        if not samples_ok:
            context.log.warning(f"samples_under_speculation: {sampling['cause']}")
        yield check_result(
            samples_ok, sampling, blocking_severity=dg.AssetCheckSeverity.WARN, check_name="samples_under_speculation", asset_key=DRAFTER_KEY
        )

    @dg.asset_check(
        asset=drafter_checkpoint,
        blocking=True,
        automation_condition=condition,
        description="Every weight name of the SGLang export is one SGLang's loader recognises (it drops unknown names silently).",
    )
    def sglang_names(inference_server: InferenceServerResource, storage: StorageResource) -> dg.AssetCheckResult:
        preset, out, summary = _trained(inference_server, storage)
        if "sglang" not in summary["exports"]:
            vllm_dir = out / "drafter-vllm"
            note = vllm_only_reason(folder_num_layers(vllm_dir), summary["aux_layer_ids"], preset.num_layers, folder_drafts_in_parallel(vllm_dir))
            return check_result(True, {"note": note or "exported for vLLM only"})
        dropped = check_sglang_names(list(read_drafter_tensors(out / "drafter-sglang")))
        return check_result(not dropped, {"unrecognised_names": dropped})

    @dg.asset_check(
        asset=drafter_checkpoint,
        blocking=True,
        automation_condition=condition,
        description="On a warm start, the fine-tune is not clearly worse than its parent on the same held-out samples "
        "(a paired comparison beyond their sampling error); the exports hold whichever measured higher.",
    )
    def not_worse_than_parent(inference_server: InferenceServerResource, storage: StorageResource) -> dg.AssetCheckResult:
        _, _, summary = _trained(inference_server, storage)
        if not summary.get("warm_start"):
            return check_result(True, {"note": "trained from scratch: no parent to compare with"})
        if summary.get("finetune_skipped"):
            return check_result(True, {"note": summary["finetune_skipped"], "parent_val_al": summary.get("parent_val_al")})
        comparison = summary.get("parent_comparison")
        if comparison is not None:
            keys = ("verdict", "kept", "parent_al", "finetuned_al", "difference", "low", "high", "samples", "sentence")
            return check_result(comparison["verdict"] != "worse", {k: comparison[k] for k in keys} | {"parent": summary["warm_start"]})
        # A summary written before the trainer compared per sample: equal counts summed in another
        # order differ in the eighth digit, and equal is not worse.
        parent_al, val_al = summary.get("parent_val_al"), summary.get("val_al")
        passed = parent_al is not None and val_al is not None and val_al >= parent_al - AL_ROUNDING
        return check_result(passed, {"val_al": val_al, "parent_val_al": parent_al, "parent": summary["warm_start"]})

    return [drafter_serves, sglang_names, not_worse_than_parent]


DRAFTER_CHECKS = drafter_checks()
"""The checks as `eagle-assets check` and the tests run them (no automation condition)."""
DRAFTER_CHECK_NAMES = ("serves_in_vllm", "samples_under_speculation", "sglang_names", "not_worse_than_parent")
"""Their names, in the order they run and are listed."""
