"""What this node thinks of its peers, in one place: the peer book (``peers/book.py``).

Roles hand it what a peer did as a value (``peers/outcomes.py``) and ask it whom to ignore, who
is a trainer-set member, whom to ask first and what the workers should know (``PeerView``).
"""
