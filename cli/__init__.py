"""cli: the `hetero-node` command and the assembly of running nodes.

    main.py      the entry point (`hetero-node`): runs the app, a mistake in one line (errors.py)
    app.py       the typer app and what its commands share: the group, logging, config loading
    commands_run.py    the commands on one machine: demo, local, simulate
    commands_swarm.py  the swarm's: bootstrap, join, peer-id, leaderboard, status
    commands_tools.py  the files': plot, init
    config.py    each command's config root (simulate's and join's here; local's in node/local.py)
    options.py   the option types several commands share, and the loss choices
    network.py   the network flags as [network] overrides
    paths.py     the paths a user names, checked and claimed by one process
    roles/       what `join` and `bootstrap` run: swarm/ and node/ are assembled into a node here
    simulate.py  a swarm in one process (node's roles on swarm.memory)
    demo.py      a whole local swarm as processes (procs.py reaps them by process group)
    status.py, progress.py, plot.py   what a user sees
    configs/     the example configs `hetero-node init` writes
"""
