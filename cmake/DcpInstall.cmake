# Installation and the exported package (dcpConfig.cmake): see the launcher issue.
