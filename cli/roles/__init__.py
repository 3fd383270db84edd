"""What `hetero-node join` and `bootstrap` run: a role on the real swarm, until told to stop.

This is where a running node is assembled: the swarm side (`SwarmNode`, links, discovery) and the
node side (`Learner`, `Sampler`, engines) meet here and nowhere else. Order matters: the DHT
(which forks) starts before the model is loaded; every network wait has a timeout; a peer that
loses its counterpart waits and retries with backoff and says so; every `status_every_s` a role
logs one status line, and a summary when it stops; on stop the learner checkpoints, the sampler
closes its outbox, and the DHT and p2pd are shut down.

    common.py     joining the swarm, pacing, the volunteers' command line
    bootstrap.py  a coordinator's peer and its learners file
    learner.py    a learner: built with its link (the Intake seam), its loop (LearnerRun)
    report.py     the learner's status line and summary; a sampler's metrics records
    sampler.py    a sampler: follow the learner, generate, send
    both.py       sampler,learner in one process (LocalSampler)

Importing it loads torch, transformers and hivemind: the CLI imports it only inside the commands
that run a role. The `join` config tree: cli/config.py.
"""

from cli.roles.bootstrap import LearnersFile, parse_learners, read_learners_file, run_bootstrap
from cli.roles.both import LocalSampler, run_both
from cli.roles.common import reachability_check, start_node, tcp_port, volunteer_command
from cli.roles.learner import LearnerRun, accepted_models, make_learner, run_learner
from cli.roles.sampler import run_sampler

__all__ = ["LearnerRun", "LearnersFile", "LocalSampler", "accepted_models", "make_learner", "parse_learners",
           "reachability_check", "read_learners_file", "run_bootstrap", "run_both", "run_learner", "run_sampler",
           "start_node", "tcp_port", "volunteer_command"]
