"""The DHT worker (hivemind, asyncio, its Go ``p2pd``): records peers publish, who may write them,
joining the swarm, the p2pd push plane, and the node's typed client of that worker.
"""
