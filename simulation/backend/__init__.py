"""The simulated inference backend (the contract and the client of a real one: backends/)."""
