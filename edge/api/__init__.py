"""edge.api"""
