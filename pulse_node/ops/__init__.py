"""Operations surface: the swarm dashboard (``pulse-node status``) and health checks (``pulse-node doctor``).

``snapshot`` turns node statuses (``StatusReport``, ``daemon/status_model.py``) and DHT peer
records into one declared ``SwarmSnapshot`` (pure, unit-tested); ``sources`` gathers those
inputs (run dir or DHT + /status); ``render`` draws a snapshot with rich (the one renderer of
``pulse-node status`` and ``pulse-node swarm``); ``checks`` and ``doctor`` diagnose one
machine. No torch here.
"""
