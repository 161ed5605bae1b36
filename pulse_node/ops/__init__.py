"""Operations surface: the swarm dashboard (``pulse-node status``) and health checks (``pulse-node doctor``).

``snapshot`` turns node status dicts and DHT peer records into one declared ``SwarmSnapshot``
(pure, unit-tested); ``sources`` gathers those inputs (run dir or DHT + /status); ``render``
draws a snapshot with rich; ``checks`` and ``doctor`` diagnose one machine. No torch here.
"""
