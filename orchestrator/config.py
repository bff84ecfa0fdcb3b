"""Settings of a training run, as one dataclass the CLI, the demo and the tests fill in."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class ServerConfig:
    """What the orchestrator trains and how it runs rounds.

    Defaults follow EmbracingFL appendix 6.1 where it gives one (tau = 10 local steps, batch 32,
    SGD with momentum 0.9 and weight decay 1e-4).
    """

    model: str = "digits_mlp"
    strategy: str = "embracingfl"
    strategy_options: dict[str, object] = field(default_factory=dict)
    rounds: int = 20
    fraction: float = 1.0
    min_devices: int = 2
    quorum: float = 1.0
    deadline_s: float = 120.0
    # How long a device whose update upload was cut by its connection stays awaited in the round
    # (it usually reconnects within seconds and resumes the transfer); then it is a straggler.
    upload_resume_s: float = 15.0
    wait_devices_s: float = 120.0
    local_steps: int = 10
    batch_size: int = 32
    lr: float = 0.05
    # Step decay of the local learning rate: rounds after each of these get lr_decay times the rate
    # before (EmbracingFL appendix 6.2: CIFAR-10 decays by 10 after rounds 800 and 900 of 1,000).
    lr_decay_at: tuple[int, ...] = ()
    lr_decay: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 1e-4
    seed: int = 0
    eval_every: int = 1
    eval_data: str = "digits"
    data_root: str | None = None
    eval_limit: int | None = None
    store_dir: Path = Path("runs/serve")
    resume: bool = False
    host: str = "127.0.0.1"
    port: int = 0  # 0: any free port (local fleets); `edgetrain serve` defaults to 8765
    token: str = ""  # shared by every device: a lab setting (docs/security.md)
    # Every device proves its own enrolled credential (edgetrain device enroll); the token is unused.
    require_credentials: bool = False
    credential_skew_s: float = 120.0
    tls_cert: str | None = None  # PEM certificate chain: serve wss:// (devices verify it)
    tls_key: str | None = None  # its private key, unless tls_cert holds it
    frame_size: int = 256 << 10  # sent frames: hashing starts sooner (bench/transport.py)
    planner_batch: int = 32
    # Times a round whose result fails its checks (non-finite values, chunks that fail their
    # export check) runs again from the last good state before it is journaled as failed.
    round_retries: int = 2
    # Bounded influence (docs/security.md): a report weighs at most the sample count its device
    # registered, capped here; with norm_bound > 0, an update whose norm exceeds norm_bound times
    # the median of recent accepted updates of the same selection is clipped to it ("clip") or refused ("reject").
    max_device_samples: int = 100_000
    # A transfer that makes no progress for transfer_stall_s, or averages less than transfer_min_rate
    # bytes/s after transfer_grace_s, is dropped and its device disconnected (a straggler).
    transfer_stall_s: float = 30.0
    transfer_min_rate: float = 16 << 10
    transfer_grace_s: float = 10.0
    # Connections held at once, of which at most max_pending_hellos not yet past their hello
    # (each has hello_timeout_s to say it); more are refused with an error frame.
    max_connections: int = 20_000
    max_pending_hellos: int = 1_000
    hello_timeout_s: float = 30.0
    norm_bound: float = 0.0
    norm_bound_action: str = "clip"
    # Honour a hello's labels["force_split"] (emulation and tests only: it overrides the planner).
    allow_forced_split: bool = False
    keep_checkpoints: int = 3
    # Exported chunks kept on disk (store_dir/chunks), oldest removed first after every round.
    chunk_disk_bytes: int = 1 << 30
    # Where verified training graphs (and the export check's refusals) are kept; None: store_dir/train_graphs.
    # Graphs depend on the architecture only, so servers of one model may share a directory.
    train_graph_dir: Path | None = None

    def lr_at(self, round_number: int) -> float:
        """The local learning rate devices train round ``round_number`` with (1-based): the step schedule
        is the server's, so a resumed run continues it and devices need no schedule of their own."""
        return self.lr * self.lr_decay ** sum(round_number > m for m in self.lr_decay_at)

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["store_dir"] = str(self.store_dir)
        d["train_graph_dir"] = None if self.train_graph_dir is None else str(self.train_graph_dir)
        return d
