"""cli: the `hetero-node` command and the assembly of running nodes.

    main.py      the typer app: flags, config files, one-line errors (errors.py)
    roles.py     what `join` and `bootstrap` run: swarm/ and node/ meet here
    simulate.py  a swarm in one process (node roles on swarm.memory)
    demo.py      a whole local swarm as processes (procs.py reaps them by process group)
    status.py, progress.py, plot.py   what a user sees
    configs/     the example configs `hetero-node init` writes
"""
