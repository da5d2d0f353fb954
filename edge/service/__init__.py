"""edge.service"""
