"""Settings of a training run: one dataclass, each field declared once with its type, default, help and
constraint, from which ``edgetrain serve``'s options and a fleet file's ``[training]`` table follow.

A setting is added here only: ``name: Type = setting(default, "help")``. Its type carries its constraint
(``Count``, ``Fraction``, ``Literal[...]``, ``Annotated[float, Range(...)]``, see :mod:`edge_sdk.values`);
``cli=`` names (or hides) its ``edgetrain serve`` option; :data:`TRAINING_SETTINGS` lists the ones a fleet
file's ``[training]`` table may set. Every ``ServerConfig`` is checked when it is made, and a bad value is
a :class:`SettingError` naming the field (the one error type of every setting, device and server:
:mod:`edge_sdk.values`); each front end renders the name in its own spelling.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, get_type_hints

from edge_sdk.codecs import CODECS
from edge_sdk.codecs.delta import DELTA_BITS
from edge_sdk.references import is_reference
from edge_sdk.values import (ByteSize, Count, Fraction, NonNegative, NonNegativeInt, Positive, Range, SettingError,
                             convert)
from orchestrator.aggregation.privacy import ACCOUNTANTS, ALLOCATIONS, MECHANISMS, SAMPLINGS
from orchestrator.rounds import ROUND_DRIVERS

__all__ = ["EXACT_TRANSFERS", "TRAINING_SETTINGS", "ServerConfig", "SettingError", "setting", "setting_hints"]

Round = Annotated[int, Range(1)]
Port = Annotated[int, Range(0, 65535)]
# The choices of a setting that names a registered thing are its registry's names, never a list typed here.
#: Any codec of the registry (edge_sdk.codecs.CODECS): what an update may travel through; or auto (chosen in
#: ServerConfig.__post_init__).
UpdateCodec = Literal[("auto", *CODECS)]  # type: ignore[valid-type]
#: Lossless codecs: ONNX bytes (chunks, training graphs) must arrive bit for bit.
ByteCodec = Literal[tuple(n for n, c in CODECS.items() if c.lossless)]  # type: ignore[valid-type]
#: Deterministic codecs (lossless, or lossy without randomness): the weights a device starts from.
WeightCodec = Literal[tuple(n for n, c in CODECS.items() if c.lossless or not c.unbiased)]  # type: ignore[valid-type]
#: Delta downloads: none, or a quantized difference of one of edge_sdk.codecs.delta's widths.
DeltaWidth = Literal[("none", *(f"int{b}" for b in sorted(DELTA_BITS, reverse=True)))]  # type: ignore[valid-type]
Accountant = Literal[tuple(ACCOUNTANTS)]  # type: ignore[valid-type]
Sampling = Literal[tuple(SAMPLINGS)]  # type: ignore[valid-type]
RoundMode = Literal[tuple(ROUND_DRIVERS)]  # type: ignore[valid-type]
Allocation = Literal[tuple(ALLOCATIONS)]  # type: ignore[valid-type]


def setting(default: Any = None, help: str = "", *, cli: str | bool = True, cli_default: Any = None,
            factory: Any = None, names: str = "") -> Any:
    """A ServerConfig field: its default, its help text, and its ``edgetrain serve`` option (``cli``: the
    option's name, True: ``--field-name``, False: none; ``cli_default``: the option's own default).
    ``names``: ``package.module:NAME`` of the registry a setting names an entry of, whose names a front
    end prints beside the help (read there: the registry may import what a setting must not)."""
    meta = {"help": help, "cli": cli, "cli_default": cli_default, "names": names}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class ServerConfig:
    """What the orchestrator trains and how it runs rounds.

    Defaults follow EmbracingFL appendix 6.1 where it gives one (tau = 10 local steps, batch 32,
    SGD with momentum 0.9 and weight decay 1e-4).
    """

    model: str = setting("digits_mlp", "Model: a zoo name, or package.module:factory for one of your own (docs/models.md).")
    strategy: str = setting("embracingfl", "Strategy: a registered name, or package.module:Class for one of your own "
                                           "(docs/architecture.md, \"Strategies\").",
                            names="orchestrator.strategies:STRATEGY_NAMES")
    strategy_options: dict[str, object] = setting(
        factory=dict, cli=False, help="KEY=VALUE option of the strategy, typed by its constructor (-O, repeatable).")
    rounds: Count = setting(20, "Rounds to run.")
    fraction: Fraction = setting(1.0, "Share of idle connected devices sampled per round.")
    min_devices: NonNegativeInt = setting(2, "Connected devices to wait for before a round starts.")
    quorum: Fraction = setting(1.0, "Share of selected devices whose updates close a round early.")
    deadline_s: Positive = setting(120.0, "Seconds after which a round closes without its stragglers.",
                                   cli="--deadline")
    # Buffered asynchronous rounds (FedBuff, Nguyen et al. 2022, Algorithm 1; docs/buffered.md).
    round_mode: RoundMode = setting(
        "synchronous", "How rounds run: synchronous (a cohort per round, waited for until its quorum, grace or "
                       "deadline) or buffered (up to --concurrency devices train at once, each on the model version "
                       "it was sent; every --buffer-size updates, each weighed by its staleness, step the model).",
        names="orchestrator.rounds:ROUND_DRIVERS")
    concurrency: Count = setting(100, "Buffered rounds: devices training at once (FedBuff's concurrency).")
    buffer_size: Count = setting(10, "Buffered rounds: updates folded before the model steps (FedBuff's K).")
    server_lr: Positive = setting(1.0, "Buffered rounds: the server learning rate the buffer's mean update "
                                       "is applied with (FedBuff's eta_g).")
    staleness_exponent: NonNegative = setting(
        0.5, "Buffered rounds: an update s versions stale weighs (1 + s)^-a; 0.5 is FedBuff's 1/sqrt(1 + s), 0 "
             "weighs every update alike.")
    max_staleness: NonNegativeInt = setting(100, "Buffered rounds: an update more versions stale than this is not folded.")
    upload_resume_s: NonNegative = setting(
        15.0, "How long a device whose update upload was cut by its connection stays awaited in the round "
              "(it usually reconnects within seconds and resumes the transfer); then it is a straggler.", cli=False)
    wait_devices_s: NonNegative = setting(
        float("inf"), "Seconds to wait for --min-devices (for any selectable device, in a later round) before giving "
                      "up; inf (the default: a server is a service): until they come, saying so every 10 s.",
        cli="--wait-devices")
    local_steps: Count = setting(10, "Local steps per round (tau).")
    batch_size: Count = setting(32, "Local mini-batch size.")
    lr: Positive = setting(0.05, "Local learning rate.")
    lr_decay_at: tuple[Round, ...] = setting(
        (), "Rounds after which the learning rate is multiplied by --lr-decay, comma-separated (e.g. 800,900): "
            "EmbracingFL appendix 6.2 decays CIFAR-10's by 10 after rounds 800 and 900 of 1,000.")
    lr_decay: Annotated[float, Range(0, 1, low_open=True)] = setting(0.1, "Factor of each --lr-decay-at step.")
    momentum: Annotated[float, Range(0, 1, high_open=True)] = setting(0.9, "SGD momentum of local training.",
                                                                      cli=False)
    weight_decay: NonNegative = setting(1e-4, "SGD weight decay of local training.", cli=False)
    loss_after: bool = setting(
        True, "Devices score their loss after local training (one forward pass of a batch a round, about a sixth "
              "of 5 steps' work); false: a train report has the loss before training and the mean loss of the "
              "local steps.", cli=False)
    seed: NonNegativeInt = setting(0, "Seed of the model's initial weights (and of device sampling in plain runs "
                                      "without --sample-seed).")
    sample_seed: NonNegativeInt | None = setting(
        None, "Seed of device sampling, for reproducible plain runs; none: --seed. Under --dp or "
              "--secure-aggregation cohorts are secret draws from os.urandom and a sample seed is refused.")
    eval_every: NonNegativeInt = setting(1, "Evaluate every n rounds (0: never).")
    eval_data: str = setting("digits", "Held-out dataset for evaluation.", cli="--data")
    eval_source: str = setting(
        "", "Evaluation set of your own: a .npz (arrays x, y), .npy or .csv table (label in the last column), or "
            "package.module:function returning (x, y) arrays or a data source; none: no evaluation on the server. "
            "Default: the test split of --data.", cli="--eval-data")
    data_root: str | None = setting(
        None, "Folder holding the research datasets, each in its folder (default: $EDGETRAIN_DATA); digits and "
              "the synthetic sets need none.")
    eval_limit: Count | None = setting(None, "Evaluate on at most this many held-out samples.", cli=False)
    store_dir: Path = setting(
        Path("runs/serve"), "Folder for the SQLite journal and checkpoints (edgetrain serve: a new "
                            "runs/serve-<time> folder per run unless given; --resume needs the run's).", cli="--store")
    resume: bool = setting(False, "Continue from the last completed round in --store.")
    start_from: str = setting(
        "", "Start round 1 from this model instead of the seed's: a torch state dict (edgetrain export's model.pt) "
            "or an .npz of arrays by state name, trained elsewhere; the fleet fine-tunes it (docs/models.md, "
            "\"Fine-tuning from a starting model\").")
    host: str = setting("127.0.0.1", "Address to listen on.")
    port: Port = setting(0, "Port to listen on (0: any free port).", cli_default=8765)
    token: str = setting("", "Shared token every device must present (empty: none); a lab setting, see "
                             "docs/security.md.")
    require_credentials: bool = setting(False, "Every device proves its own credential (edgetrain device enroll "
                                               "--store ...); --token is then unused.")
    credential_skew_s: NonNegative = setting(120.0, "Clock skew allowed on a credential's timestamp.", cli=False)
    tls_cert: str | None = setting(None, "PEM certificate chain: serve wss:// (TLS) instead of ws://.")
    tls_key: str | None = setting(None, "Private key of --tls-cert (if not in the same file).")
    frame_size: Count = setting(256 << 10, "Bytes per sent frame (hashing starts sooner).", cli=False)
    planner_batch: Count = setting(32, "Batch size the planner budgets activations for.", cli=False)
    round_retries: NonNegativeInt = setting(
        2, "Times a round whose result fails its checks (non-finite values, chunks that fail their export check) "
           "runs again from the last good state before it is journaled as failed.")
    # Bounded influence (docs/security.md).
    max_device_samples: Count = setting(100_000, "Most samples one device's report may weigh.")
    transfer_stall_s: NonNegative = setting(30.0, "Seconds a transfer may make no progress before it is dropped.",
                                            cli="--transfer-stall")
    transfer_min_rate: NonNegative = setting(16 << 10, "Bytes/s a transfer must average (after a grace period) "
                                                       "not to be dropped.")
    transfer_grace_s: NonNegative = setting(10.0, "Seconds before --transfer-min-rate applies.", cli=False)
    fetch_rate: Positive = setting(50.0, "Fetches per second one device may average (bursts of 4 s of them); a "
                                         "device over it is cut off with an error frame.")
    fetch_repeats: Count = setting(
        4, "Times over a device may fetch, in one round, the payloads its instructions name (count and bytes: "
           "resumes after a reconnect fit); a device over it is cut off with an error frame.")
    straggler_policy: Literal["grace", "deadline"] = setting(
        "grace", "When a round stops waiting for its stragglers: grace (once --straggler-quorum of its "
                 "instructions are answered, the rest get --straggler-grace, or as long as that took if longer) "
                 "or deadline (they are waited for until --deadline).")
    straggler_quorum: Fraction = setting(0.5, "Share of a round's instructions answered that starts the straggler "
                                              "grace period.", cli=False)
    straggler_grace_s: NonNegative = setting(
        10.0, "Least time a round waits for its stragglers once --straggler-quorum answered (straggler policy "
              "grace).", cli="--straggler-grace")
    straggler_pacing: bool = setting(True, "A device too slow for the round's grace is asked for the local steps that fit its measured speed.")
    revocation_poll_s: Positive = setting(
        1.0, "How often the server looks for credentials revoked (edgetrain device revoke) while it runs, to "
             "close their connections.", cli=False)
    max_connections: Count = setting(20_000, "Connections held at once; more are refused.")
    max_pending_hellos: Count = setting(1_000, "Connections not yet past their hello held at once (those proven "
                                               "in their upgrade request's Authorization header not counted).",
                                        cli=False)
    max_pending_per_address: Count = setting(
        16, "Connections from one IP address not yet past their hello, and not proven in their upgrade request, "
            "held at once; more get HTTP 429 (docs/security.md, \"The door\").", cli=False)
    hello_timeout_s: Positive = setting(30.0, "Seconds a connection has to say its hello.", cli=False)
    norm_bound: NonNegative = setting(
        1.0, "Clip (or refuse, --norm-bound-action reject) an update whose norm at any layer group exceeds this "
             "multiple of its reference: the larger of the server's own update on its held-out data this round "
             "and the median of earlier updates of that group; 0: off (docs/security.md, \"Norm bound\").")
    norm_bound_action: Literal["clip", "reject"] = setting("clip", "What --norm-bound does to an update over it.")
    direction_trust: bool = setting(
        True, "Weigh each device's update, per layer group, by ReLU of its cosine with the server's own update this "
              "round (FLTrust's trust score): an update pointing away from it weighs nothing in that group's mean "
              "(docs/security.md, \"Bounded influence by default\").")
    trust_floor: Annotated[float, Range(0, 1)] = setting(
        0.0, "Least weight --direction-trust leaves an update (a soft variant for honest devices whose data points "
             "away from the server's; a sign-flipped update then keeps this much weight too).", cli=False)
    max_loss_rise: NonNegative = setting(
        1.0, "A round whose model's validation loss exceeds (1 + this) x the committed model's, plus 0.1, is not "
             "committed (it runs again, then is journaled as failed); 0: no validation before commit.")
    validation_samples: NonNegativeInt = setting(
        1024, "Held-out samples round validation scores each round: a fixed random subset, the same every round "
              "(a round it must catch at least doubles the loss, which a thousand samples show plainly); 0: all. "
              "An evaluation round whose set is no larger scores once for both.", cli=False)
    allow_forced_split: bool = setting(
        False, "Honour a hello's labels[\"force_split\"] (emulation and tests only: it overrides the planner).",
        cli=False)
    keep_checkpoints: Count = setting(3, "Checkpoints kept in the store.", cli=False)
    chunk_disk_bytes: Annotated[int, Range(0), ByteSize()] = setting(
        1 << 30, "Disk kept for exported chunks in --store (oldest removed first).", cli="--chunk-disk",
        cli_default="1GiB")
    # What travels: the defaults are the setting bench/round_bytes.py measured as `delta4+eden2` (a quarter of
    # float32's bytes per device-round and less, at float32's accuracy; bench/validated.toml [defaults] holds them).
    chunk_codec: ByteCodec = setting(
        "shuffle", "Codec the frozen chunks (ONNX) travel through: a lossless one (docs/protocol.md, \"Codecs on the "
                   "wire\"); shuffle: byte planes, then deflate.")
    tail_codec: WeightCodec = setting(
        "none", "Codec the trainable tail's weights travel to the device through: a lossless one, or a deterministic "
                "lossy one (float16, or the blockwise grid, nearest).")
    graph_codec: ByteCodec = setting(
        "shuffle", "Codec the training graphs (ONNX) travel through: a lossless one.")
    download_delta: DeltaWidth = setting(
        "int4", "Frozen chunks' and tails' weights travel to the device quantized (nearest, blockwise 8/4/2-bit grid): "
                "the whole payload to a device holding nothing, else the difference from the version it holds "
                "(docs/protocol.md, \"Delta downloads\"); none: as the chunk and tail codecs say.")
    download_delta_keep: Count = setting(
        2, "Rounds of the reconstructions sent to devices that the server keeps as delta bases (each costs a model's "
           "bytes); a device holding an older one downloads its payload whole.", cli=False)
    update_codec: UpdateCodec = setting(
        "auto", "Codec the devices' updates travel through: a lossless one; a biased lossy one (the device keeps error "
                "feedback); or an unbiased one (stochastic rounding on a blockwise grid, or EDEN's random rotation) "
                "(docs/protocol.md, \"Codecs\"); auto: eden2, or none with --secure-aggregation (a masked update is "
                "ring words, not a coded one).")
    web: bool = setting(False, "Also serve, on the same port, a device page (a phone or a browser joins by "
                               "opening it) and a read-only status page behind the devices' token or credentials "
                               "(docs/web.md).")
    web_demo_shards: Count = setting(8, "Shards of --data's training split the device page trains on (each tab "
                                        "takes one, as the Python device's --client k --num-clients n).",
                                     cli=False)
    web_sdk: str | None = setting(None, "The JavaScript SDK folder --web serves its build and onnxruntime-web from "
                                        "(default: edge_sdk_js beside the orchestrator package).")
    # User-level central differential privacy (docs/security.md, "Differential privacy").
    dp: bool = setting(False, "Central differential privacy: each device's update clipped per block, Gaussian noise on "
                              "each block's sum, (epsilon, delta) accounted after every round (docs/security.md).")
    dp_noise_multiplier: Positive | None = setting(
        None, "Noise multiplier z of the model (noise standard deviation over the clip); none: the smallest that "
              "keeps --dp-target-epsilon over --rounds.")
    dp_target_epsilon: Positive | None = setting(
        None, "Epsilon the run may spend: it ends, with a message, before a round that would exceed it.")
    dp_delta: Annotated[float, Range(0, 1, low_open=True, high_open=True)] | None = setting(
        None, "Delta of the accounting; none: min(1e-5, 1/N^1.1) for N = --min-devices.")
    dp_clip: Positive = setting(1.0, "L2 clip C of one device's whole update: each of the model's L blocks is "
                                     "clipped to C/sqrt(L) (the initial clips with --dp-adaptive-clip).")
    dp_adaptive_clip: bool = setting(False, "Move each block's clip towards --dp-target-quantile of its update norms "
                                            "(Andrew et al., 2021), with a noised count of its own.")
    dp_target_quantile: Annotated[float, Range(0, 1, low_open=True, high_open=True)] = setting(
        0.5, "Share of updates adaptive clipping aims to leave unclipped.", cli=False)
    dp_clip_lr: Positive = setting(0.2, "Learning rate of adaptive clipping's geometric update.", cli=False)
    dp_count_stddev: NonNegative | None = setting(
        None, "Noise on adaptive clipping's count of unclipped updates; none: the block's expected cohort / 20.",
        cli=False)
    dp_mechanism: str | None = setting(
        None, "Privacy mechanism: a registered name, or package.module:Class for one of your own (docs/security.md, "
              "\"Privacy mechanisms\"); none: central Gaussian noise, or with --secure-aggregation the devices' "
              "discrete Gaussian shares.", names="orchestrator.aggregation.privacy:MECHANISMS")
    dp_ftrl_epoch: NonNegativeInt = setting(
        0, "With --dp-mechanism ftrl: rounds per tree (the tree restarts after them; each device takes part at most "
           "once per tree); 0: floor(N / K), the most rounds in which K of N devices can each take part once.")
    dp_ftrl_lr: Positive = setting(1.0, "With --dp-mechanism ftrl: the server's learning rate on the noised prefix "
                                         "sum of mean updates.", cli=False)
    dp_allocation: Allocation = setting(
        "uniform", "How the model's noise is shared between blocks: uniform (z sqrt(L) each) or utility (the "
                   "multipliers that minimise the noise on the mean update for the same model epsilon: blocks with "
                   "few devices or many coordinates get less noise; docs/security.md, \"Per-block noise\").")
    dp_accountant: Accountant = setting("pld", "Privacy accountant (dp-accounting); fixed-size sampling is always "
                                               "accounted with rdp.")
    dp_sampling: Sampling = setting(
        "fixed", "How the accountant takes each round's cohort: fixed (ceil(--fraction x N) of the N idle devices, "
                 "as the server draws it) or poisson (each device independently with probability --fraction).")
    dp_min_cohort: Count = setting(10, "Fewest devices a round may sample under DP: a noised mean of fewer is "
                                       "mostly noise.", cli=False)
    dp_min_survivors: Fraction = setting(
        0.7, "With --secure-aggregation (distributed noise): the share of a block's cohort whose noise shares must "
             "survive for its sum to be revealed; each device adds the noise of that many (unless "
             "dp_expected_survivors says otherwise), so the more survive, the more noise (and epsilon spent less).",
        cli=False)
    dp_expected_survivors: Fraction | None = setting(
        None, "With --secure-aggregation (distributed noise): the share of a block's cohort expected to survive; "
              "each device adds the noise of that many, so a round where they survive spends what the plan says "
              "and one where fewer do (down to dp_min_survivors) spends more, as the ledger records. None: "
              "dp_min_survivors (no round ever below the planned multiplier).", cli=False)
    # Secure aggregation (docs/security.md, "Secure aggregation").
    secure_aggregation: bool = setting(
        False, "Secure aggregation (SecAgg+ with a cohort per block): the server learns each block's sum over the "
               "devices that trained it, never one device's update (docs/security.md).")
    secure_clip: Positive = setting(1.0, "L2 bound each device clips each block of its update to before masking "
                                         "(under secure aggregation the server cannot bound one update).")
    secure_value_bits: NonNegativeInt = setting(0, "With --secure-aggregation: bits q (2-24) each device rounds a "
        "coordinate to, in a ring of bit_length(cohort (2^(q-1) - 1)) + 1 bits, its masked words packed at that width "
        "(docs/security.md, 'Compressed secure uploads'); 0: the 32-bit ring, int32 words (a float32 update's size).")
    secure_threshold: NonNegativeInt = setting(
        0, "Fewest surviving devices whose sum of a block is revealed (t); a block with fewer keeps its value. "
           "0: SecAgg+'s secret threshold for the cohort (a majority of a neighbourhood), at least 3.")
    secure_degree: NonNegativeInt = setting(0, "Neighbours per device in the SecAgg+ graph; 0: the whole cohort up to "
                                               "33 devices, else 3 log2 n.", cli=False)
    secure_group_size: NonNegativeInt = setting(0, "Secure groups of >= this many devices, each sum bounded alone; 0: one.")
    secure_group_norm: Literal["own", "reference"] = setting("own", "A secure group's mean at its own norm, capped at the "
                                                             "reference's ('own'), or scaled to it ('reference').")
    secure_stage_s: Positive = setting(30.0, "Seconds a key, share or unmasking stage waits for its devices "
                                             "(longer for phones on slow links or a loaded server).")
    train_graph_dir: Path | None = setting(None, "Where verified training graphs are kept (default: "
                                                 "--store/train_graphs); servers of one model may share it.", cli=False)

    def __post_init__(self) -> None:
        auto_codec = self.update_codec == "auto" or isinstance(self.update_codec, _AutoCodec)
        for name, hint in setting_hints().items():
            try:
                setattr(self, name, convert(getattr(self, name), hint, text=False))
            except ValueError as exc:
                raise SettingError(name, str(exc)) from None
        self.lr_decay_at = tuple(sorted(self.lr_decay_at))
        if auto_codec:  # decided here: every reader sees the codec the devices use
            self.update_codec = _AutoCodec("none" if self.secure_aggregation else AUTO_UPDATE_CODEC)
        if self.tls_key is not None and self.tls_cert is None:
            raise SettingError("tls_key", "a private key needs its certificate (tls_cert)")
        if self.dp_expected_survivors is not None and self.dp_expected_survivors < self.dp_min_survivors:
            raise SettingError("dp_expected_survivors", f"{self.dp_expected_survivors:g} is below dp_min_survivors "
                               f"{self.dp_min_survivors:g}: no fewer can be expected than the floor that is waited for")
        if self.dp_mechanism is not None and self.dp_mechanism not in MECHANISMS and not is_reference(self.dp_mechanism):
            raise SettingError("dp_mechanism", f"unknown mechanism {self.dp_mechanism!r}; known: "
                                               f"{', '.join(MECHANISMS)}, or package.module:Class")
        if self.secure_aggregation and (conflict := self.secure_conflict()):
            raise SettingError("secure_aggregation", conflict)
        if self.sample_seed is not None and (self.dp or self.secure_aggregation):
            raise SettingError("sample_seed", "a seeded cohort is predictable: under dp and secure aggregation "
                                              "cohorts are secret draws (docs/security.md)")

    @property
    def cohort_seed(self) -> int | None:
        """The seed of each round's cohort draw; None, a secret draw from ``os.urandom``, under DP (its
        amplification by sampling assumes nobody knows the cohort) and secure aggregation (a known
        cohort tells who is in each masked sum). Plain runs: ``sample_seed``, or ``seed`` when unset."""
        if self.dp or self.secure_aggregation:
            return None
        return self.seed if self.sample_seed is None else self.sample_seed

    def secure_conflict(self) -> str | None:
        """Why secure aggregation cannot run with these settings: what needs one device's update in the clear.
        (Whether the strategy can is its own declaration, ``Strategy.combines``: asked where it is built.)"""
        return _masked_words_conflict(self)

    def lr_at(self, round_number: int) -> float:
        """The local learning rate devices train round ``round_number`` with (1-based): the step schedule
        is the server's, so a resumed run continues it and devices need no schedule of their own."""
        return self.lr * self.lr_decay ** sum(round_number > m for m in self.lr_decay_at)

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["store_dir"] = str(self.store_dir)
        d["train_graph_dir"] = None if self.train_graph_dir is None else str(self.train_graph_dir)
        return d


#: The settings a fleet file's [training] table may give (the rest follow from the fleet or the run).
TRAINING_SETTINGS: tuple[str, ...] = ("strategy", "rounds", "fraction", "local_steps", "batch_size", "lr",
                                      "lr_decay_at", "lr_decay", "momentum", "weight_decay", "eval_source",
                                      "start_from",
                                      "norm_bound", "direction_trust", "trust_floor", "max_loss_rise",
                                      "validation_samples", "loss_after", "dp",
                                      "dp_noise_multiplier", "dp_target_epsilon", "dp_delta", "dp_clip",
                                      "dp_adaptive_clip", "dp_target_quantile", "dp_clip_lr", "dp_count_stddev",
                                      "dp_mechanism", "dp_ftrl_epoch", "dp_ftrl_lr", "dp_allocation", "dp_accountant", "dp_sampling", "dp_min_cohort",
                                      "dp_min_survivors",
                                      "dp_expected_survivors",
                                      "secure_aggregation",
                                      "secure_clip", "secure_value_bits", "secure_threshold", "secure_group_size",
                                      "secure_group_norm", "round_mode",
                                      "concurrency", "buffer_size",
                                      "server_lr", "staleness_exponent", "max_staleness")

def _masked_words_conflict(config: ServerConfig) -> str | None:
    """Why the masked words cannot be what these settings ask: a coded update, or a compressed round that is
    out of range or would carry distributed noise (its ring has no room for the noise's tail); or an adaptive clip."""
    if config.dp and config.dp_adaptive_clip:
        return "dp_adaptive_clip needs each update's norm in the clear; distributed noise keeps a fixed clip"
    if config.update_codec != "none":
        return (f"update_codec {config.update_codec}: a masked update is ring words, not a coded update "
                "(secure_value_bits compresses them)")
    if config.secure_value_bits and not 2 <= config.secure_value_bits <= 24:
        return f"secure_value_bits {config.secure_value_bits}: a compressed round's values have 2 to 24 bits"
    if config.secure_value_bits and config.dp:
        return "secure_value_bits with dp: distributed noise needs the 32-bit ring (a compressed ring has no room for it)"
    return None


class _AutoCodec(str):
    """The update codec ``auto`` chose: its name for every reader, and chosen again when a copy of the
    settings (``dataclasses.replace``) turns secure aggregation on or off."""


#: The update codec ``update_codec = "auto"`` gives where secure aggregation does not exclude one: EDEN at 2
#: bits a coordinate (bench/round_bytes.py's `delta4+eden2`; bench/validated.toml [defaults]).
AUTO_UPDATE_CODEC = "eden2"

#: The transfer settings under which every payload, download and update arrives as it was sent (float32,
#: no codec, no delta): what a comparison with a framework that sends float32 arrays, or a check of exact
#: means, runs under. The defaults above are lossy (bench/validated.toml [defaults]).
EXACT_TRANSFERS: dict[str, str] = {"chunk_codec": "none", "tail_codec": "none", "graph_codec": "none",
                                   "download_delta": "none", "update_codec": "none"}


@functools.cache
def setting_hints() -> dict[str, Any]:
    """Field name -> its type (with its constraint), resolved once."""
    return get_type_hints(ServerConfig, include_extras=True)
