"""The serving layer: a server process started from a command given as data, recorded, waited for, stopped.

    runrecord.py RunRecord (<run_dir>/server.json) and the server log's tail
    events.py    what a launch reports while it runs; rigstack/output/launch.py renders them
    process.py   start a recorded process group, find it running, stop it by its record
    unit.py      Unit: one server process to start, as data; its URL; its launch as a shell command
    ready.py     the staged wait (alive, /health, /v1/models, one token), launch() and launch_units()

A profile on one host (rigstack.launch, its replicas behind rigstack.replicas' router), one engine across hosts
(rigstack.multinode) and a fleet (rigstack.fleetlaunch) all sit on this layer, side by side.
"""
