"""hidden_states"""
