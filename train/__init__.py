"""The trainer that torchrun starts on every rank.

It imports nothing from `launcher/` so that a node needs only torch (plus numpy for PowerSGD,
scikit-learn for the digits set and Pillow for image folders).
"""
