"""What a peer may do here: its budget on the data plane and its standing (earned, never claimed).
"""
