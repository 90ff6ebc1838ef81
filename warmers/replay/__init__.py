"""A request log replayed in virtual time through the shipped warming (`stoker analyze
--warming`): a virtual exact cache (cache.py), the warm sends into it (sender.py), the loop
(run.py) and its figures (report.py)."""
