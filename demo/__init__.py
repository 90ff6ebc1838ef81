"""`stoker demo`: two weeks of CLINC150 traffic through the embedded stack, told as a report."""
