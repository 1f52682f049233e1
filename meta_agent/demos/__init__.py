"""Demonstration episodes for the SFT warm start: scripted ideal actions per task family, played through the real episode."""
